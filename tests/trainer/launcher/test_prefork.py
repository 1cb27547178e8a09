"""trainer/launcher/prefork: a worker forked by the pod's zygote behaves, to the launcher, as a cold one
would.

One real zygote (the preloaded trainer) serves the module's tests; each test starts workers through the
real client, the way ft_launcher does (`python -m ...` with the zygote's socket in the environment).
The worker here is a probe module in the test's working directory, run as `python -m` would run it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT as REPO
from trainer.launcher.prefork import PID_ENV, PID_FILE_SUFFIX, SOCKET_ENV

READY_S = 180.0

PROBE = """
import json, os, signal, sys, time
import trainer.launcher.prefork
mode = sys.argv[1]
if mode == "report":
    print(json.dumps({
        "argv": sys.argv[1:], "cwd": os.getcwd(), "probe": os.environ.get("PROBE"),
        "pid": os.getpid(), "ppid": os.getppid(), "launcher": trainer.launcher.prefork.launcher_pid(),
        "torch_preloaded": "torch" in sys.modules, "socket_env": os.environ.get("TRAINER_PREFORK_SOCKET"),
    }), flush=True)
    print("to stderr", file=sys.stderr, flush=True)
    sys.exit(7)
if mode == "lose":  # the node-loss fault: kill this worker's launcher agent with its whole group
    os.environ["TORCHELASTIC_RUN_ID"] = "probe"
    from trainer.runtime.faults import _lose_node
    _lose_node()
if mode == "wait":  # run until a file "go" appears in the working directory, then exit 5
    print(os.getpid(), flush=True)
    while not os.path.exists("go"):
        time.sleep(0.05)
    sys.exit(5)
if mode == "term":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(3))
print(os.getpid(), flush=True)
while True:
    time.sleep(0.05)
"""

CLIENT = (
    "import sys; from trainer.launcher.prefork.client import run_forked; "
    "sys.exit(run_forked('probe', sys.argv[1:]))"
)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _start_zygote(sock: Path) -> tuple[subprocess.Popen[str], dict[str, str]]:
    """A zygote whose parent is this test process, once it is ready; the environment a worker needs to
    reach it."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "trainer.launcher.prefork.server", str(sock), str(os.getpid())],
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + READY_S
    while not sock.exists():
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        assert time.monotonic() < deadline, "the zygote never bound its socket"
        time.sleep(0.1)
    return proc, {**os.environ, SOCKET_ENV: str(sock), PID_ENV: str(proc.pid), "PYTHONPATH": str(REPO)}


@pytest.fixture(scope="module")
def zygote(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    proc, env = _start_zygote(tmp_path_factory.mktemp("zy") / "z.sock")
    yield env
    proc.kill()
    proc.wait()


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    (tmp_path / "probe.py").write_text(PROBE)
    return tmp_path


def _start(env: dict[str, str], cwd: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", CLIENT, *args],
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _worker_pid(client: subprocess.Popen[str]) -> int:
    assert client.stdout is not None
    return int(client.stdout.readline())


def test_the_worker_runs_with_the_clients_argv_env_cwd_stdio_and_exit_status(
    zygote: dict[str, str], workdir: Path
) -> None:
    client = _start({**zygote, "PROBE": "from the client"}, workdir, "report", "a b", "--x=1")
    out, err = client.communicate(timeout=60)
    assert client.returncode == 7, err
    got = json.loads(out)
    assert got["argv"] == ["report", "a b", "--x=1"]
    assert got["cwd"] == str(workdir) and got["probe"] == "from the client"
    assert got["ppid"] == int(zygote[PID_ENV]), "forked by the zygote"
    assert got["launcher"] == os.getpid(), "launcher_pid() is the stand-in's parent (here: this test)"
    assert got["torch_preloaded"], "the zygote had imported torch before it forked"
    assert SOCKET_ENV == "TRAINER_PREFORK_SOCKET"
    assert got["socket_env"] is None, "the worker itself never asks the zygote again"
    assert "to stderr" in err


def test_a_worker_killed_by_a_signal_ends_its_stand_in_with_the_same_signal(
    zygote: dict[str, str], workdir: Path
) -> None:
    client = _start(zygote, workdir, "sleep")
    worker = _worker_pid(client)
    os.kill(worker, signal.SIGKILL)  # as NVRx's rank monitor does to a hung rank
    assert client.wait(timeout=30) == -signal.SIGKILL


def test_killing_the_stand_in_kills_the_worker(zygote: dict[str, str], workdir: Path) -> None:
    client = _start(zygote, workdir, "sleep")
    worker = _worker_pid(client)
    client.kill()  # as the launcher's SIGKILL of a worker's process group does
    client.wait(timeout=30)
    deadline = time.monotonic() + 10
    while _alive(worker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(worker), "the lifeline must take the worker down with its stand-in"


def test_killing_the_stand_in_kills_a_frozen_worker(zygote: dict[str, str], workdir: Path) -> None:
    # A frozen worker (SIGSTOP, or hung in C holding the GIL) runs no thread of its own, lifeline included:
    # the zygote, its parent, must end it, or it keeps its rank monitor connection (and its GPU).
    client = _start(zygote, workdir, "sleep")
    worker = _worker_pid(client)
    os.kill(worker, signal.SIGSTOP)
    try:
        client.kill()
        client.wait(timeout=30)
        deadline = time.monotonic() + 10
        while _alive(worker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(worker), "a frozen worker outlived its stand-in"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(worker, signal.SIGKILL)


def test_workers_outlive_a_killed_zygote_and_their_stand_ins_report_how_they_ended(
    workdir: Path, tmp_path: Path
) -> None:
    # The zygote killed from outside (its own zygote: the module's serves the other tests) while two
    # workers train: both run on, one exits with its own status, the other is killed by a signal.
    proc, env = _start_zygote(tmp_path / "z.sock")
    clients = []
    try:
        clients = [_start(env, workdir, "wait"), _start(env, workdir, "sleep")]
        workers = [_worker_pid(c) for c in clients]
        proc.kill()
        proc.wait()
        time.sleep(0.5)
        assert all(_alive(w) for w in workers), "a worker died with its zygote"
        assert all(c.poll() is None for c in clients), "a stand-in ended with the zygote"
        (workdir / "go").touch()
        assert clients[0].wait(timeout=30) == 5, "the worker's own exit status, from the status pipe"
        os.kill(workers[1], signal.SIGKILL)
        assert clients[1].wait(timeout=30) == -signal.SIGKILL
    finally:
        for client in clients:
            client.kill()
        proc.kill()


def test_sigterm_to_the_stand_in_reaches_the_worker(zygote: dict[str, str], workdir: Path) -> None:
    client = _start(zygote, workdir, "term")
    _worker_pid(client)
    client.send_signal(signal.SIGTERM)  # the launcher stopping its workers
    assert client.wait(timeout=30) == 3, "the worker's own SIGTERM handler decided the status"


def test_without_a_live_zygote_the_worker_starts_cold(tmp_path: Path) -> None:
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    env = {
        **os.environ,
        SOCKET_ENV: str(tmp_path / "none.sock"),
        PID_ENV: dead.stdout.strip(),
        "PYTHONPATH": str(REPO),
    }
    proc = subprocess.run(
        [sys.executable, "-m", "trainer", "--check-config", "--", f"--data-path={tmp_path / 'missing.npy'}"],
        env=env,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "starting cold" in proc.stderr
    assert proc.returncode == 2 and "config error: data_path" in proc.stderr


def test_the_wrapper_execs_the_command_and_the_zygote_dies_with_it(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "trainer.launcher", "--", "sh", "-c", f'echo "$$ ${PID_ENV} ${SOCKET_ENV}"'],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    shell_pid, zygote_pid, sock = proc.stdout.split()
    assert Path(sock).parent.stat().st_mode & 0o777 == 0o700, "the socket's directory is private"
    deadline = time.monotonic() + 10
    while _alive(int(zygote_pid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(int(zygote_pid)), "the zygote must die with the command it was started for"
    assert int(shell_pid) > 0


def test_the_wrapper_refuses_a_missing_command() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "trainer.launcher", "--", "no-such-launcher-here"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 127 and "no-such-launcher-here: command not found" in proc.stderr


def test_the_node_loss_fault_kills_the_launcher_not_the_zygote(zygote: dict[str, str], workdir: Path) -> None:
    # A stand-in for the launcher agent: a shell leading its own process group, starting the worker the
    # way ft_launcher does. A forked worker's parent is the zygote; the fault must go for the agent.
    agent = subprocess.Popen(
        ["sh", "-c", f'"{sys.executable}" -c "{CLIENT}" lose; sleep 60'],
        env=zygote,
        cwd=workdir,
        start_new_session=True,
    )
    assert agent.wait(timeout=60) == -signal.SIGKILL, "the agent's process group is what a lost node loses"
    assert _alive(int(zygote[PID_ENV])), "the zygote (another pod's, in a real job) must survive"


def test_a_worker_waits_for_the_replacement_zygote_its_pid_file_names(tmp_path: Path, workdir: Path) -> None:
    # The first zygote (PID_ENV) is dead; the launcher started another, still importing (a sleeper here):
    # the worker waits for it instead of importing cold beside it, and starts cold once it dies too.
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    importing = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        sock = tmp_path / "z.sock"
        Path(f"{sock}{PID_FILE_SUFFIX}").write_text(str(importing.pid))
        env = {**os.environ, SOCKET_ENV: str(sock), PID_ENV: dead.stdout.strip(), "PYTHONPATH": str(REPO)}
        client = _start(env, workdir, "report")
        time.sleep(1.0)
        assert client.poll() is None, "the worker did not wait for the zygote being started"
        importing.kill()
        _, err = client.communicate(timeout=60)
        assert "starting cold" in err
    finally:
        importing.kill()
        importing.wait()
