"""The pod's main process under ft_launcher (trainer/launcher/supervise.py): ft_launcher starts again on
the same pod when the rendezvous service was replaced, and only then."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT
from trainer.launcher.rendezvous import EPOCH_KEY
from trainer.launcher.supervise import (
    EPOCH_FILE_ENV,
    VERDICT_SUFFIX,
    Supervisor,
    read_epoch,
    record_service_after_failure,
    wait_for_other_epoch,
)
from trainer.runtime.ports import free_port


def _child(tmp_path: Path, *codes: int, epoch: str | None = "e1", verdict: str | None = None) -> list[str]:
    """A stand-in for ft_launcher: the n-th start writes `epoch` (if any) where ft.py would, and the
    `verdict` on the service (if any), then exits with codes[n]; it counts its starts in tmp_path/starts."""
    write = f"open(os.environ[{EPOCH_FILE_ENV!r}], 'w').write({epoch!r})" if epoch else "pass"
    if verdict is not None:
        write += f"; open(os.environ[{EPOCH_FILE_ENV!r}] + {VERDICT_SUFFIX!r}, 'w').write({verdict!r})"
    starts = str(tmp_path / "starts")
    code = (
        f"import os, pathlib; p = pathlib.Path({starts!r}); n = len(p.read_text()) if p.exists() else 0; "
        f"p.write_text('x' * (n + 1)); {write}; raise SystemExit({list(codes)!r}[n])"
    )
    return [sys.executable, "-c", code]


def _supervisor(tmp_path: Path, command: list[str], other: dict[str, str | None]) -> Supervisor:
    asked: list[str] = []

    def other_epoch(endpoint: str, epoch: str, wait_s: float) -> str | None:
        asked.append(epoch)
        return other.get(epoch)

    sup = Supervisor(command, "svc:1", str(tmp_path / "epoch"), other_epoch=other_epoch, log=lambda m: None)
    sup.asked = asked  # type: ignore[attr-defined]
    return sup


def test_a_replaced_service_starts_ft_launcher_again(tmp_path: Path) -> None:
    sup = _supervisor(tmp_path, _child(tmp_path, 1, 0), {"e1": "e2"})
    assert sup.run() == 0
    assert sup.restarts == 1
    assert (tmp_path / "starts").read_text() == "xx"


def test_the_same_service_means_ft_launcher_failed_on_its_own(tmp_path: Path) -> None:
    sup = _supervisor(tmp_path, _child(tmp_path, 3, 0), {"e1": None})
    assert sup.run() == 3
    assert sup.restarts == 0 and sup.asked == ["e1"]  # type: ignore[attr-defined]


@pytest.mark.parametrize(("verdict", "status", "restarts"), [("e2", 0, 1), ("", 3, 0)])
def test_ft_launchers_verdict_on_the_service_is_taken_without_a_check_of_its_own(
    tmp_path: Path, verdict: str, status: int, restarts: int
) -> None:
    """ft_launcher tells whether the service was replaced ("e2") or not (""): no interpreter is started to
    ask the store again (it imports torch: seconds on every failing pod's exit)."""
    sup = _supervisor(tmp_path, _child(tmp_path, 3, 0, verdict=verdict), {"e1": "e2"})
    assert sup.run() == status
    assert sup.restarts == restarts and sup.asked == []  # type: ignore[attr-defined]


def test_ft_launcher_records_whether_the_service_it_joined_was_replaced(tmp_path: Path) -> None:
    import torch.distributed as dist

    port = free_port()
    store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
    store.set(EPOCH_KEY, "e2")
    epoch_file = tmp_path / "epoch"
    verdict = tmp_path / f"epoch{VERDICT_SUFFIX}"
    record_service_after_failure(f"127.0.0.1:{port}", str(epoch_file), wait_s=1.0)
    assert not verdict.exists(), "no epoch was ever learnt: nothing to say"
    epoch_file.write_text("e2")
    record_service_after_failure(f"127.0.0.1:{port}", str(epoch_file), wait_s=1.0)
    assert verdict.read_text() == ""  # the same service answers: not replaced
    epoch_file.write_text("e1")
    record_service_after_failure(f"127.0.0.1:{port}", str(epoch_file), wait_s=1.0)
    assert verdict.read_text() == "e2"  # another one answers
    del store
    epoch_file.write_text("e2")
    record_service_after_failure(f"127.0.0.1:{free_port()}", str(epoch_file), wait_s=0.5)
    assert verdict.read_text() == ""  # nothing answers in time: not replaced either


def test_no_epoch_no_supervision(tmp_path: Path) -> None:
    """A launcher-hosted store (torchrun, is_host) has no epoch: its failure is the pod's, as before."""
    sup = _supervisor(tmp_path, _child(tmp_path, 1, 0, epoch=None), {"e1": "e2"})
    assert sup.run() == 1
    assert sup.asked == []  # type: ignore[attr-defined]


def test_a_signal_is_forwarded_and_ends_supervision(tmp_path: Path) -> None:
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    sup = _supervisor(tmp_path, sleeper, {"e1": "e2"})
    threading.Timer(1.0, sup.forward, args=(signal.SIGTERM,)).start()
    started = time.monotonic()
    assert sup.run() == 128 + signal.SIGTERM
    assert time.monotonic() - started < 30
    assert sup.restarts == 0


@pytest.mark.slow
def test_a_new_service_process_has_a_new_epoch(tmp_path: Path) -> None:
    """The real service (python -m trainer.launcher.rendezvous, NVRx's nvrx-control): each process
    writes a fresh epoch; the supervisor's reader sees the change once the replacement listens."""
    port = free_port()
    argv = [
        sys.executable, "-m", "trainer.launcher.rendezvous", "--nnodes=1:1", "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=epoch-test", "--ft-enable-log-server=false",
    ]  # fmt: skip

    def start() -> tuple[subprocess.Popen[bytes], str]:
        proc = subprocess.Popen(argv, cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            epoch = read_epoch(f"127.0.0.1:{port}", timeout_s=1.0)
            if epoch:
                return proc, epoch
            time.sleep(0.2)
        proc.kill()
        raise AssertionError("the rendezvous service never answered")

    first, epoch = start()
    try:
        first.kill()
        first.wait()
        assert read_epoch(f"127.0.0.1:{port}", timeout_s=1.0) is None  # gone: nothing answers
        second, new = start()
        try:
            assert new != epoch
            assert wait_for_other_epoch(f"127.0.0.1:{port}", epoch, 5.0) == new
            assert wait_for_other_epoch(f"127.0.0.1:{port}", new, 5.0) is None  # not replaced
        finally:
            second.terminate()
            assert second.wait(timeout=30) == 0  # SIGTERM ends it cleanly
    finally:
        first.kill()


@pytest.mark.parametrize(("exit_with", "status"), [("0", 0), ("3", 3), ("None", 0), ("'no nodes'", 1)])
def test_ft_launcher_ends_with_nvrx_exit_code_and_no_interpreter_teardown(
    tmp_path: Path, exit_with: str, status: int
) -> None:
    """A launcher that finished aborted in the interpreter's teardown (SIGABRT), and the supervisor
    started it again over a completed run: trainer.launcher.ft now exits with NVRx's code at once."""
    torn = tmp_path / "teardown-ran"
    script = (
        "import atexit, pathlib, sys\n"
        "from nvidia_resiliency_ext.fault_tolerance import launcher\n"
        f"atexit.register(lambda: pathlib.Path({str(torn)!r}).write_text('x'))\n"
        f"launcher.main = lambda: sys.exit({exit_with})\n"
        "from trainer.launcher import ft\n"
        "ft.main(['ft_launcher', '--nproc-per-node=1', 'train.py'])\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == status, proc.stderr[-2000:]
    assert not torn.exists(), "the interpreter's teardown ran after NVRx's main"
    if status == 1:
        assert "no nodes" in proc.stderr


@pytest.mark.parametrize(("exit_with", "verdict"), [("3", ""), ("0", None)])
def test_a_failing_ft_launcher_leaves_its_verdict_on_the_service(
    tmp_path: Path, exit_with: str, verdict: str | None
) -> None:
    """trainer.launcher.ft asks the store it joined before it exits non-zero (and only then)."""
    import torch.distributed as dist

    port = free_port()
    store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
    store.set(EPOCH_KEY, "e1")
    epoch_file = tmp_path / "epoch"
    epoch_file.write_text("e1")  # as ft.py's thread writes it once the service answers
    script = (
        "import sys\n"
        "from nvidia_resiliency_ext.fault_tolerance import launcher\n"
        f"launcher.main = lambda: sys.exit({exit_with})\n"
        "from trainer.launcher import ft\n"
        f"ft.main(['ft_launcher', '--rdzv-endpoint=127.0.0.1:{port}', '--nproc-per-node=1', 'train.py'])\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, EPOCH_FILE_ENV: str(epoch_file)},
    )
    assert proc.returncode == int(exit_with), proc.stderr[-2000:]
    written = tmp_path / f"epoch{VERDICT_SUFFIX}"
    assert (written.read_text() if written.exists() else None) == verdict, proc.stderr[-2000:]


def test_an_evicted_straggler_ends_ft_launcher_and_leaves_with_the_eviction_status(tmp_path: Path) -> None:
    """SIGUSR1 from the pod's own worker (trainer/runtime/straggler_watch.py): ft_launcher is killed, not
    started again (a signal from outside would restart it), and the pod exits EVICTED_EXIT."""
    from trainer.launcher.supervise import EVICTED_EXIT
    from trainer.resilience.straggler import EVICTED_EXIT as SCORER_EXIT

    assert EVICTED_EXIT == SCORER_EXIT  # the supervisor imports no torch, so it keeps its own copy
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    # A child this process had before the supervisor started (here: the test runner's own, as a jsii
    # node process or a resource tracker) is not ft_launcher's leftover: it must outlive the eviction.
    bystander = subprocess.Popen(sleeper)
    try:
        sup = _supervisor(tmp_path, sleeper, {"e1": "e2"})
        threading.Timer(1.0, sup.evict).start()
        started = time.monotonic()
        assert sup.run() == EVICTED_EXIT
        assert time.monotonic() - started < 30
        assert sup.restarts == 0
        assert bystander.poll() is None, "the supervisor ended a child that was there before it"
    finally:
        bystander.kill()
        bystander.wait()


def test_a_dead_zygote_is_replaced_on_the_same_socket_a_bounded_number_of_times(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainer.launcher import __main__ as wrapper

    sock = tmp_path / "zygote.sock"
    started: list[list[str]] = []
    real_popen = subprocess.Popen

    def popen(argv: list[str], **kwargs: object) -> subprocess.Popen[bytes]:
        started.append(argv)
        assert not sock.exists(), "a dead zygote's socket is removed before the next one binds it"
        sock.touch()  # as the zygote's bind would
        return real_popen([sys.executable, "-c", "import time; time.sleep(60)"])

    monkeypatch.setattr(wrapper.subprocess, "Popen", popen)
    logged: list[str] = []
    zygote = wrapper.Zygote(str(sock), ["team.train"], log=logged.append)
    assert zygote.pids() == {zygote.proc.pid}, "a live zygote is kept as it is"
    for restart in range(1, wrapper.ZYGOTE_RESTARTS + 2):
        old = zygote.proc
        old.kill()
        old.wait()
        kept = zygote.pids()
        if restart <= wrapper.ZYGOTE_RESTARTS:
            assert kept == {zygote.proc.pid} and zygote.proc is not old
            assert (
                f"ended (signal 9); its workers train on; starting a fresh zygote (restart {restart})"
                in (logged[-1])
            )
    assert len(started) == 1 + wrapper.ZYGOTE_RESTARTS, "restarts are bounded"
    assert all(a[-3:] == [str(sock), str(os.getpid()), "team.train"] for a in started)
    zygote.proc.kill()
