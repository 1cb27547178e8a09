"""Tier 2: heartbeats, the SIGTERM path of survivors, and hard faults recovered through ft_launcher."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import REPO_ROOT as REPO
from tests.helpers import free_port
from tests.trainer._jobs import newest_commit_before
from tests.trainer.resilience import _pods as pods
from tools.localpods import LocalJob
from trainer.resilience.heartbeat import RANK_MONITOR_SOCKET_ENV, Heartbeat


# --------------------------------------------------------------------------------------- heartbeat
class FakeClient:
    def __init__(self, fail_beats: bool = False) -> None:
        self.calls: list[str] = []
        self.fail_beats = fail_beats

    def init_workload_monitoring(self) -> None:
        self.calls.append("init")

    def send_heartbeat(self) -> None:
        if self.fail_beats:
            raise ConnectionResetError("monitor gone")
        self.calls.append("beat")

    def shutdown_workload_monitoring(self) -> None:
        self.calls.append("shutdown")


def test_heartbeat_is_a_noop_outside_ft_launcher() -> None:
    made: list[FakeClient] = []

    def factory() -> FakeClient:
        made.append(FakeClient())
        return made[-1]

    hb = Heartbeat.from_env({}, client_factory=factory)
    assert not hb.enabled
    hb.start()
    hb.beat()
    hb.stop()
    assert made == [] and hb.beats_sent == 0 and not hb.started


def test_heartbeat_connects_once_and_beats_under_ft_launcher() -> None:
    client = FakeClient()
    hb = Heartbeat.from_env({RANK_MONITOR_SOCKET_ENV: "/tmp/x.socket"}, client_factory=lambda: client)
    assert hb.enabled
    hb.start()
    hb.start()  # a second in-process iteration must not reconnect
    hb.beat()
    hb.beat()
    hb.stop()
    hb.beat()  # after stop: nothing is sent
    assert client.calls == ["init", "beat", "beat", "shutdown"]
    assert hb.beats_sent == 2


def test_heartbeat_throttles_and_survives_a_lost_monitor() -> None:
    client = FakeClient()
    hb = Heartbeat(enabled=True, client_factory=lambda: client, min_interval_s=3600)
    hb.start()
    for _ in range(5):
        hb.beat()
    assert client.calls.count("beat") == 1
    broken = FakeClient(fail_beats=True)
    hb2 = Heartbeat(enabled=True, client_factory=lambda: broken)
    hb2.start()
    hb2.beat()  # must not raise into the training step
    assert not hb2.enabled and not hb2.started and broken.calls == ["init", "shutdown"]
    with pytest.raises(ValueError, match="min_interval_s"):
        Heartbeat(enabled=True, min_interval_s=-1)


# ------------------------------------------------------------------------------------- termination
def _run_child(code: str, tmp_path: Path, *args: str) -> subprocess.Popen[str]:
    script = tmp_path / f"child{abs(hash(code))}.py"
    script.write_text(textwrap.dedent(code))
    return subprocess.Popen(
        [sys.executable, str(script), str(tmp_path), *args],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


BLOCKED_IN_GLOO = """
    import datetime, os, sys, time, pathlib
    import torch, torch.distributed as dist
    from trainer.resilience.termination import install_termination_handler
    out, rank, port = pathlib.Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    if rank == 0:
        install_termination_handler(lambda signum: (out / "detected").write_text(str(signum)))
    store = dist.TCPStore("127.0.0.1", port, 2, rank == 0)
    timeout = datetime.timedelta(seconds=60)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=2, timeout=timeout)
    if rank == 1:  # a peer that never joins the collective, like a dead or hung rank
        time.sleep(120)
        os._exit(0)
    print("ready", flush=True)
    # Blocked in C inside gloo: a plain Python SIGTERM handler would run only when this returns, after
    # the 60 s collective timeout (measured: 15.8 s late with a 20 s timeout).
    dist.all_reduce(torch.ones(1))
    print("all_reduce returned", flush=True)
"""


@pytest.mark.slow
def test_sigterm_runs_the_callback_and_exits_143_while_blocked_in_gloo(tmp_path: Path) -> None:
    port = free_port()
    peer = _run_child(BLOCKED_IN_GLOO, tmp_path, "1", str(port))
    child = _run_child(BLOCKED_IN_GLOO, tmp_path, "0", str(port))
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        time.sleep(0.5)  # let it enter the collective
        sent = time.monotonic()
        child.send_signal(signal.SIGTERM)
        rc = child.wait(timeout=30)
        took = time.monotonic() - sent
    finally:
        child.kill()
        peer.kill()
        peer.wait()
    assert rc == 128 + signal.SIGTERM
    assert (tmp_path / "detected").read_text() == str(int(signal.SIGTERM))
    assert took < 10, f"exit took {took:.1f} s: the handler waited for the collective"


SLOW_CALLBACK_AND_FORK = """
    import os, signal, sys, time, pathlib
    from trainer.resilience.termination import install_termination_handler
    out = pathlib.Path(sys.argv[1])
    install_termination_handler(lambda signum: time.sleep(60), callback_timeout_s=0.5)
    # A forked child must not inherit the handler: its SIGTERM would terminate this process.
    pid = os.fork()
    if pid == 0:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    print("child", os.WTERMSIG(status) if os.WIFSIGNALED(status) else -1, flush=True)
    time.sleep(600)
"""


def test_child_resets_handler_and_a_stuck_callback_cannot_delay_the_exit(tmp_path: Path) -> None:
    child = _run_child(SLOW_CALLBACK_AND_FORK, tmp_path)
    try:
        assert child.stdout is not None
        assert child.stdout.readline().split() == ["child", str(int(signal.SIGTERM))]
        assert child.poll() is None  # the child's SIGTERM did not take the parent down
        sent = time.monotonic()
        child.send_signal(signal.SIGTERM)
        rc = child.wait(timeout=10)
        took = time.monotonic() - sent
    finally:
        child.kill()
    assert rc == 128 + signal.SIGTERM
    assert took < 5


def test_termination_handler_rejects_bad_timeout() -> None:
    from trainer.resilience.termination import install_termination_handler

    with pytest.raises(ValueError, match="callback_timeout_s"):
        install_termination_handler(lambda s: None, callback_timeout_s=0)


# ------------------------------------------------------------------ hard faults through ft_launcher
# The pod command of Contract 2, run as LocalJob pods on 127.0.0.1 (tests/trainer/resilience/_pods.py:
# values, timeouts, the completion check). The lost pod: test_node_loss.py, one run with the survivor's
# exit.
@pytest.fixture(scope="module")
def token_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from trainer.reference.data import write_synthetic_tokens
    from trainer.reference.model import PRESETS

    path = tmp_path_factory.mktemp("data") / "tokens.npy"
    return write_synthetic_tokens(path, 200_000, PRESETS["tiny"].vocab_size, seed=7)


def first_restore_after_the_fault(evs: list[dict[str, Any]]) -> dict[str, Any]:
    """The new workers' restore: the first after the injected fault (not restart 1: a worker group that
    failed to start, a port taken by another process say, is restarted before the fault too)."""
    (fault,) = [e for e in evs if e["ev"] == "fault_injected"]
    return next(e for e in evs if e["ev"] == "restore" and float(e["t"]) > float(fault["t"]))


def _job(tmp_path: Path, data: Path, *, nnodes: int, nproc: int, extra: list[str]) -> LocalJob:
    return pods.job(tmp_path, data, nnodes=nnodes, nproc=nproc, extra=extra)


@pytest.mark.slow
@pytest.mark.soak  # make test: test_exact_resume.py kills rank 0 the same way and checks the same
def test_sigkilled_rank_is_restarted_by_ft_launcher(tmp_path: Path, token_file: Path) -> None:
    with _job(
        tmp_path, token_file, nnodes=1, nproc=2, extra=["--inprocess", "--fault=sigkill:step=9:rank=1"]
    ) as job:
        job.start()
        result = job.wait(timeout_s=pods.JOB_TIMEOUT_S)
    assert result.succeeded, result.reason + pods.logs(tmp_path)
    out = tmp_path / "run"
    summary = pods.assert_completed_once_more(out, tmp_path, restarted_ranks={0, 1})
    (fault,) = summary["faults"]
    assert fault["type"] == "sigkill" and fault["rank"] == 1 and fault["step"] == 9
    # Tier 2 recovered it: the launcher stopped the survivor (its SIGTERM handler reported tier 2; its
    # Wrapper may have seen the dead peer first and reported tier 1) and restarted both workers.
    evs = pods.events(out)
    # From the newest commit before the new workers' restore: 5, as a rule (8 was in flight).
    restore = first_restore_after_the_fault(evs)
    assert fault["recovered"] and 5 <= fault["restored_step"] == newest_commit_before(evs, restore["t"]) < 9
    t_fault = float(fault["t"])
    detected = [e for e in evs if e["ev"] == "fault_detected" and float(e["t"]) >= t_fault]
    assert any(e["rank"] == 0 and int(e["tier"]) == 2 for e in detected), detected
    first = next(e for e in evs if e["ev"] == "step" and float(e["t_start"]) >= t_fault)
    new_pids = {e["pid"] for e in evs if e["ev"] == "run_start" and float(e["t"]) > t_fault}
    assert first["pid"] in new_pids and int(first["step"]) == 6


@pytest.mark.slow
@pytest.mark.parametrize(
    ("faults", "by_heartbeat"),
    [
        # Every rank stuck in Python: no collective is pending, so only the heartbeat can notice.
        # make soak: test_hang_detection.py catches every rank hung under ft_launcher in make test.
        pytest.param(["hang:step=9:rank=0", "hang:step=9:rank=1"], True, marks=pytest.mark.soak),
        # One rank frozen (SIGSTOP): its peer's collective times out first, then the launcher stops the
        # workers; the frozen one needs SIGKILL (from its rank monitor or the launcher's stop timeout).
        (["stop:step=9:rank=1"], False),
    ],
    ids=["hang-all-ranks", "stop-one-rank"],
)
def test_hung_ranks_are_detected_and_restarted(
    tmp_path: Path, token_file: Path, faults: list[str], by_heartbeat: bool
) -> None:
    # Tier 1 off: this is about what tier 2 detects on its own.
    extra = ["--no-inprocess", *(f"--fault={f}" for f in faults)]
    with _job(tmp_path, token_file, nnodes=1, nproc=2, extra=extra) as job:
        job.start()
        result = job.wait(timeout_s=pods.JOB_TIMEOUT_S)
    assert result.succeeded, result.reason + pods.logs(tmp_path)
    out = tmp_path / "run"
    summary = pods.assert_completed_once_more(out, tmp_path, restarted_ranks={0, 1})
    assert len(summary["faults"]) == len(faults)
    evs = pods.events(out)
    # From the newest commit before the new workers' restore: 5, as a rule (8 was in flight).
    restore = first_restore_after_the_fault(evs)
    restored = newest_commit_before(evs, restore["t"])
    assert 5 <= restored < 9
    assert all(f["recovered"] and f["tier"] == 2 for f in summary["faults"]), summary["faults"]
    assert {f["restored_step"] for f in summary["faults"]} == {restored}
    t_fault = min(float(f["t"]) for f in summary["faults"])
    restarted = min(float(e["t"]) for e in evs if e["ev"] == "run_start" and float(e["t"]) > t_fault)
    logs = pods.logs(tmp_path, tail=10**7)
    if by_heartbeat:
        assert "Did not get subsequent heartbeat" in logs
        # Nothing else could have noticed before the heartbeat timeout.
        assert restarted - t_fault >= pods.TIMEOUTS["heartbeat"]
    else:
        assert restarted - t_fault >= pods.TIMEOUTS["collective"]
