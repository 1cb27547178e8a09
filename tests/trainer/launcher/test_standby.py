"""Warm standbys (trainer/launcher/standby.py): a pre-imported process handed the next start of
ft_launcher (trainer/launcher/supervise.py) or of the rendezvous service (trainer/launcher/rendezvous.py
`Keeper`), instead of a replacement that imports torch on the recovery path.

Stand-ins with nothing to import serve the hand-over tests; the real service is in one slow test, and
what a standby costs the job is measured by tests/trainer/launcher/test_external_kills.py (make soak)."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

from tests.helpers import REPO_ROOT
from trainer.launcher import standby as sb
from trainer.launcher.rendezvous import wait_port_free
from trainer.launcher.supervise import EPOCH_FILE_ENV, STANDBY_FAILURES, read_epoch
from trainer.runtime.ports import free_port

T = TypeVar("T")

# A standby that runs what it is handed: `python -c CODE` handed [python, -c, CODE2] runs CODE2, as a
# cold start of that command would.
RUNS_ITS_START = (
    "import os, sys\n"
    "from trainer.launcher.standby import await_start, begin\n"
    "begin()\n"
    "open(os.path.join(os.environ['STUB_DIR'], f'standby.{os.getpid()}'), 'w').close()\n"
    "command = await_start()\n"
    "exec(compile(command[2], '<start>', 'exec'))\n"
)
REPORTS_ITS_START = (
    "import json, os, sys\n"
    "from trainer.launcher.standby import await_start, begin\n"
    "begin()\n"
    "command = await_start()\n"
    "comm = open('/proc/self/comm').read().strip()\n"
    "state = {'command': command, 'stdin': sys.stdin.read(), 'comm': comm}\n"
    "json.dump(state, open(os.path.join(os.environ['STUB_DIR'], 'started.json'), 'w'))\n"
)


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "STUB_DIR": str(tmp_path), "PYTHONPATH": str(REPO_ROOT)}


def _until(what: str, get: Callable[[], T], timeout_s: float = 60.0) -> T:
    deadline = time.monotonic() + timeout_s
    while not (value := get()):
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s} s"
        time.sleep(0.05)
    return value


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _pids(tmp_path: Path, kind: str) -> list[int]:
    return sorted(int(p.name.split(".")[-1]) for p in tmp_path.glob(f"{kind}.*"))


def test_a_standby_runs_exactly_the_start_it_is_handed(tmp_path: Path) -> None:
    standby = sb.Standby([sys.executable, "-c", REPORTS_ITS_START], _env(tmp_path))
    try:
        _until("the standby's name", lambda: sb.is_standby(standby.pid))
        handed = ["python", "-m", "x", "a b", "--flag=ü", ""]
        proc = standby.start(handed)
        assert proc is standby.proc and proc.wait(timeout=60) == 0
        assert standby.start(handed) is None, "one standby, one start"
    finally:
        standby.stop()
    state = json.loads((tmp_path / "started.json").read_text())
    assert state["command"] == handed
    assert state["stdin"] == "", "started, it reads /dev/null, not the supervisor's pipe"
    assert not state["comm"].startswith(sb.STANDBY_NAME), "started, it is no longer told apart as a standby"


@pytest.mark.parametrize(
    "line",
    [b"not json\n", b'{"argv": ["a"]}', b'["a"]\n', b'{"argv": ["a"], "env": {}}\n', b'{"argv": [1]}\n'],
)
def test_a_malformed_start_is_refused(line: bytes) -> None:
    with pytest.raises(ValueError, match=r"start line|Expecting|Extra data"):
        sb.parse_start(line)
    assert sb.parse_start(b'{"argv": ["a", "b"]}\n') == ["a", "b"]
    with pytest.raises(ValueError, match="over"):
        sb.parse_start(b'{"argv": ["' + b"x" * sb.MAX_START_BYTES + b'"]}\n')


def test_a_standby_handed_a_malformed_start_runs_none_of_it(tmp_path: Path) -> None:
    standby = sb.Standby([sys.executable, "-c", REPORTS_ITS_START], _env(tmp_path))
    assert standby.proc.stdin is not None
    standby.proc.stdin.write(b"\x80\x04not json\n")
    standby.proc.stdin.close()
    assert standby.proc.wait(timeout=60) == 2
    assert not (tmp_path / "started.json").exists()


def test_a_standby_dies_with_its_parent_even_while_it_imports(tmp_path: Path) -> None:
    importing = "from trainer.launcher.standby import begin; begin(); import time; time.sleep(120)"
    parent = subprocess.run(
        [
            sys.executable, "-c",
            "import sys; from trainer.launcher.standby import Standby; "
            "print(Standby([sys.executable, '-c', sys.argv[1]]).pid, flush=True)",
            importing,
        ],
        env=_env(tmp_path), capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    pid = int(parent.stdout)
    _until("the orphaned standby's end", lambda: not _alive(pid), timeout_s=20)


def _supervise(tmp_path: Path, standby: str, waits_for: str, count: int) -> dict[str, int]:
    """A Supervisor (in a process of its own: it ends its children's leftovers) over a stand-in for
    ft_launcher whose first start waits for `count` files `waits_for` in STUB_DIR, then is SIGKILLed as
    from outside; the second exits 0. `standby`: the standby's code."""
    start = (
        "import os, pathlib, signal, time\n"
        "d = pathlib.Path(os.environ['STUB_DIR'])\n"
        "n = len(list(d.glob('start.*')))\n"
        "(d / f'start.{n}.{os.getpid()}').write_text('')\n"
        f"open(os.environ[{EPOCH_FILE_ENV!r}], 'w').write('e1')\n"
        "if n == 0:\n"
        "    deadline = time.monotonic() + 60\n"
        f"    while len(list(d.glob({waits_for!r}))) < {count} and time.monotonic() < deadline:\n"
        "        time.sleep(0.05)\n"
        "    time.sleep(1.0)  # the last one's end seen by the supervisor's polls\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    driver = (
        "import json, sys\n"
        "from trainer.launcher import supervise\n"
        "supervise.STANDBY_DELAY_S = 0.0\n"
        "sup = supervise.Supervisor([sys.executable, '-c', sys.argv[1]], 'svc:1', sys.argv[3],\n"
        "    standby=[sys.executable, '-c', sys.argv[2]], log=lambda m: print(m, file=sys.stderr))\n"
        "rc = sup.run()\n"
        "print(json.dumps({'rc': rc, 'warm': sup.warm_starts, 'restarts': sup.restarts,\n"
        "    'failures': sup.standby_failures}))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", driver, start, standby, str(tmp_path / "epoch")],
        env=_env(tmp_path), capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    result: dict[str, int] = json.loads(proc.stdout)
    return result


def test_ft_launcher_killed_from_outside_is_started_again_in_its_standby(tmp_path: Path) -> None:
    result = _supervise(tmp_path, RUNS_ITS_START, "standby.*", 1)
    assert result == {"rc": 0, "warm": 1, "restarts": 1, "failures": 0}, result
    second = _pids(tmp_path, "start.1")
    standbys = _pids(tmp_path, "standby")
    assert len(second) == 1 and second[0] in standbys, "the second start ran in the process that stood by"
    assert not [pid for pid in standbys if _alive(pid)], "no standby outlives its supervisor"


def test_standbys_that_keep_dying_leave_ft_launcher_to_start_cold(tmp_path: Path) -> None:
    dies = "import os; open(os.environ['STUB_DIR'] + f'/failed.{os.getpid()}', 'w'); raise SystemExit(3)"
    result = _supervise(tmp_path, dies, "failed.*", STANDBY_FAILURES)
    assert result == {"rc": 0, "warm": 0, "restarts": 1, "failures": STANDBY_FAILURES}, result
    assert len(_pids(tmp_path, "failed")) == STANDBY_FAILURES, "no standby after the last failure"
    assert _pids(tmp_path, "start.1")[0] not in _pids(tmp_path, "failed")


def test_a_pods_standby_is_never_taken_for_its_serving_launcher_or_service() -> None:
    """tools/podkill.py and bench/recovery_pods.py find a pod's ft_launcher and the service's serving
    process among its main process' children; a standby of either has the same command line."""
    from tools import podkill

    wait = "from trainer.launcher.standby import await_start, begin; begin(); await_start()"
    sleep = "import time; time.sleep(120)"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    procs: list[subprocess.Popen[bytes]] = []
    standbys: list[sb.Standby] = []
    try:
        for module in ("trainer.launcher.ft", "trainer.launcher.rendezvous"):
            standbys.append(sb.Standby([sys.executable, "-c", wait, module], env))
            procs.append(subprocess.Popen([sys.executable, "-c", sleep, module]))
        for standby in standbys:
            _until("the standby's name", functools.partial(sb.is_standby, standby.pid))
        everyone = {p.pid for p in procs} | {s.pid for s in standbys}
        assert podkill.find("launcher", os.getpid(), everyone) == [procs[0].pid]
        assert podkill.find("rendezvous", os.getpid(), everyone) == [procs[1].pid]
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
        for standby in standbys:
            standby.stop()


def test_a_standby_service_waits_for_the_port_to_be_free() -> None:
    port = free_port()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        held.bind(("127.0.0.1", port))
        held.listen()
        started = time.monotonic()
        assert not wait_port_free(port, 0.3)
        assert time.monotonic() - started >= 0.3
    assert wait_port_free(port, 0.3)


def _keeper(tmp_path: Path, module: str, port: int, *args: str) -> subprocess.Popen[bytes]:
    code = (
        "import sys, trainer.launcher.rendezvous as r\n"
        "r.STANDBY_DELAY_S = 0.0\n"
        "sys.exit(r.Keeper(sys.argv[2:], module=sys.argv[1]).run())\n"
    )
    argv = [sys.executable, "-c", code, module, f"--rdzv-endpoint=127.0.0.1:{port}", *args]
    return subprocess.Popen(argv, env=_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.append(int(entry.name))
    return found


def test_the_services_port_goes_to_its_warm_standby_when_the_serving_process_is_killed(
    tmp_path: Path,
) -> None:
    port = free_port()
    keeper = _keeper(tmp_path, "tests.trainer.launcher.service_stub", port)
    try:
        serving = _until("a serving process", lambda: _pids(tmp_path, "serving"))
        waiting = _until(
            "a standby beside it", lambda: [p for p in _pids(tmp_path, "standby") if p not in serving]
        )
        _until("the standby's imports", lambda: sb.is_ready(waiting[0]))
        os.kill(serving[0], signal.SIGKILL)
        now = _until(
            "a new serving process", lambda: [p for p in _pids(tmp_path, "serving") if p != serving[0]]
        )
        assert now == waiting, "the standby that waited took the start, not a process started cold"
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass  # the same port answers
        _until("the next standby", lambda: len(_pids(tmp_path, "standby")) > 2)
        keeper.send_signal(signal.SIGTERM)
        assert keeper.wait(timeout=60) == 0, "SIGTERM ends the service; nothing is handed over"
    finally:
        with contextlib.suppress(ProcessLookupError):
            keeper.kill()
        keeper.wait()
    assert keeper.stdout is not None
    assert b"its standby takes the port (hand-over 1)" in keeper.stdout.read()
    assert not [pid for pid in _pids(tmp_path, "standby") if _alive(pid)], "nothing outlives the service"


@pytest.mark.slow
def test_the_real_service_answers_with_a_new_epoch_from_its_standby_within_a_second(tmp_path: Path) -> None:
    """The real service (NVRx's nvrx-control under the Keeper): its serving process SIGKILLed once its
    standby has imported, a new store (a new epoch) answers on the same port without a cold import."""
    port = free_port()
    endpoint = f"127.0.0.1:{port}"
    args = ("--nnodes=1:1", "--rdzv-backend=c10d", "--rdzv-id=standby-test", "--ft-enable-log-server=false")
    keeper = _keeper(tmp_path, "trainer.launcher.rendezvous", port, *args)
    try:
        first = _until("the service's epoch", lambda: read_epoch(endpoint, timeout_s=1.0), timeout_s=120)
        children = _children(keeper.pid)
        waiting = _until("a ready standby", lambda: [p for p in _children(keeper.pid) if sb.is_ready(p)], 120)
        serving = [p for p in children if p not in waiting]
        assert len(serving) == 1, children
        killed = time.monotonic()
        os.kill(serving[0], signal.SIGKILL)
        new = _until("a new epoch", lambda: (e := read_epoch(endpoint, timeout_s=1.0)) != first and e, 60)
        took = time.monotonic() - killed
        print(f"the service answered again {took:.2f} s after its serving process was killed")
        assert new and new != first
        assert waiting[0] in _children(keeper.pid) and not sb.is_standby(waiting[0]), "the standby serves"
        assert took < 5.0, took  # a cold replacement imports torch first: 3-5 s on a quiet machine
        keeper.send_signal(signal.SIGTERM)
        assert keeper.wait(timeout=60) == 0
    finally:
        with contextlib.suppress(ProcessLookupError):
            keeper.kill()
        keeper.wait()


def test_the_standby_ft_launcher_runs_nvrx_main_with_the_start_it_is_handed(tmp_path: Path) -> None:
    """`python -m trainer.launcher.ft --standby FT_LAUNCHER` handed ft_launcher's command line runs NVRx's
    main on it (`--help`: exit 0); handed another launcher's, nothing (exit 2)."""
    found = shutil.which("ft_launcher") or str(Path(sys.executable).with_name("ft_launcher"))
    module = [sys.executable, "-m", "trainer.launcher.ft"]
    env = _env(tmp_path)
    ours = sb.Standby([*module, sb.STANDBY_FLAG, found], env)
    other = sb.Standby([*module, sb.STANDBY_FLAG, "/elsewhere/ft_launcher"], env)
    try:
        proc = ours.start([*module, found, "--help"])
        wrong = other.start([*module, found, "--help"])
        assert proc is not None and wrong is not None
        assert proc.wait(timeout=180) == 0
        assert wrong.wait(timeout=180) == 2
    finally:
        ours.stop()
        other.stop()
