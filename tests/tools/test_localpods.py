"""LocalPod / LocalJob: a pod is its whole process tree, and the controller replaces lost pods."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT, free_port
from tools.localpods import LocalJob, LocalPod, PodSpec

# A "launcher" that starts a "worker" in its own session, as torch's launcher does (start_new_session),
# writes both PIDs, then waits forever.
TREE = """
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
open(sys.argv[1], "w").write(f"{os.getpid()} {child.pid}")
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except OSError:
        return False


def _wait_for(path: Path, timeout_s: float = 20.0) -> str:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().strip():
            return path.read_text()
        time.sleep(0.05)
    raise AssertionError(f"{path} not written within {timeout_s} s")


def _pod(tmp_path: Path, name: str, code: str, *args: str) -> LocalPod:
    return LocalPod(name, [sys.executable, "-c", code, *args], dict(os.environ), tmp_path / f"{name}.log")


def test_kill_takes_the_whole_tree_even_processes_in_other_sessions(tmp_path: Path) -> None:
    pod = _pod(tmp_path, "tree", TREE, str(tmp_path / "pids"))
    pod.start()
    try:
        root, child = (int(p) for p in _wait_for(tmp_path / "pids").split())
        assert root == pod.pid
        # The premise: the worker is outside the launcher's process group, so killpg would miss it.
        assert os.getpgid(child) != os.getpgid(root)
        assert pod.processes() == {root, child}
        killed = pod.kill()
        assert {root, child} <= killed
        deadline = time.monotonic() + 5
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(root) and not _alive(child)
        assert pod.poll() == -signal.SIGKILL
    finally:
        pod.kill()


# A "launcher" that starts a helper in its own session (as NVRx's rank monitors are), writes both PIDs
# and exits: the container's end must take the helper with it.
ORPHANING = """
import os, subprocess, sys
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
open(sys.argv[1], "w").write(f"{os.getpid()} {child.pid}")
"""


def test_a_pods_processes_end_with_its_main_process_as_a_containers_do(tmp_path: Path) -> None:
    pod = _pod(tmp_path, "orphaning", ORPHANING, str(tmp_path / "pids"))
    pod.start()
    try:
        _, child = (int(p) for p in _wait_for(tmp_path / "pids").split())
        deadline = time.monotonic() + 20
        while pod.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert pod.poll() == 0
        deadline = time.monotonic() + 5
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(child), "a helper outlived its pod's main process"
    finally:
        pod.kill()


def test_the_helpers_die_the_moment_the_main_process_does_not_at_the_next_poll(tmp_path: Path) -> None:
    """Nobody polls this pod: its helper must still die with its main process, as in a container."""
    pod = _pod(tmp_path, "orphaning", ORPHANING, str(tmp_path / "pids"))
    pod.start()
    try:
        root, child = (int(p) for p in _wait_for(tmp_path / "pids").split())
        deadline = time.monotonic() + 20
        while _alive(root) and time.monotonic() < deadline:
            time.sleep(0.01)
        ended = time.monotonic()
        while _alive(child) and time.monotonic() < ended + 5:
            time.sleep(0.01)
        assert not _alive(child), "a helper outlived its pod's main process"
    finally:
        pod.kill()


def test_terminate_sends_sigterm_to_the_main_process(tmp_path: Path) -> None:
    code = "import signal, sys, time\nsignal.signal(signal.SIGTERM, lambda *a: sys.exit(7))\n"
    code += "open(sys.argv[1], 'w').write('up')\ntime.sleep(600)\n"
    pod = _pod(tmp_path, "term", code, str(tmp_path / "up"))
    pod.start()
    _wait_for(tmp_path / "up")
    assert pod.terminate(grace_s=10) == 7


# Exits with the code listed for its index and attempt (attempts counted in a file per index).
SCRIPTED = """
import pathlib, sys, time
index, codes = sys.argv[1], sys.argv[2].split(",")
counter = pathlib.Path(sys.argv[3]) / f"attempts-{index}"
attempt = len(counter.read_text()) if counter.exists() else 0
counter.write_text("x" * (attempt + 1))
code = codes[min(attempt, len(codes) - 1)]
if code == "sleep":
    time.sleep(600)
sys.exit(int(code))
"""


def _job(tmp_path: Path, codes: list[str], **kwargs: object) -> LocalJob:
    specs = [
        PodSpec(
            f"pod-{i}",
            [sys.executable, "-c", SCRIPTED, str(i), c, str(tmp_path)],
            dict(os.environ),
            tmp_path / f"pod-{i}.log",
        )
        for i, c in enumerate(codes)
    ]
    return LocalJob(specs, **kwargs)  # type: ignore[arg-type]


def test_job_succeeds_when_every_index_exits_zero(tmp_path: Path) -> None:
    with _job(tmp_path, ["0", "0"]) as job:
        job.start()
        result = job.wait(timeout_s=60)
    assert result.succeeded, result.reason
    assert sorted((e.index, e.attempt, e.reason) for e in result.exits) == [
        (0, 0, "succeeded"),
        (1, 0, "succeeded"),
    ]


def test_failed_pod_is_replaced_within_the_backoff_limit(tmp_path: Path) -> None:
    events: list[tuple[str, dict[str, object]]] = []
    with _job(tmp_path, ["0", "3,0"], backoff_limit=1, on_event=lambda k, f: events.append((k, f))) as job:
        job.start()
        result = job.wait(timeout_s=60)
    assert result.succeeded, result.reason
    assert result.attempts(1) == 2
    assert [(e.index, e.returncode, e.reason) for e in result.exits if e.index == 1] == [
        (1, 3, "failed"),
        (1, 0, "succeeded"),
    ]
    assert [f["attempt"] for k, f in events if k == "pod_start" and f["index"] == 1] == [0, 1]


def test_backoff_limit_and_fail_job_codes_end_the_job(tmp_path: Path) -> None:
    with _job(tmp_path, ["3"], backoff_limit=0) as job:
        job.start()
        result = job.wait(timeout_s=60)
    assert not result.succeeded and "backoff limit" in result.reason
    with _job(tmp_path / "b", ["42"], backoff_limit=5, fail_job_exit_codes=[42]) as job:
        (tmp_path / "b").mkdir()
        job.start()
        result = job.wait(timeout_s=60)
    assert not result.succeeded and "FailJob" in result.reason
    assert result.attempts(0) == 1


def test_a_killed_pod_is_a_disruption_and_is_replaced(tmp_path: Path) -> None:
    # Index 0 sleeps on its first attempt and exits 0 on its second; backoff_limit=0: a disruption
    # must not count as a failure.
    with _job(tmp_path, ["sleep,0"], backoff_limit=0) as job:
        job.start()
        _wait_for(tmp_path / "attempts-0")
        first = job.pod(0).pid
        assert first in job.kill_pod(0)
        result = job.wait(timeout_s=60)
    assert result.succeeded, result.reason
    assert [(e.attempt, e.returncode, e.reason) for e in result.exits] == [
        (0, -signal.SIGKILL, "disrupted"),
        (1, 0, "succeeded"),
    ]


def test_the_rendezvous_service_listens_before_any_pod_starts_and_is_replaced(tmp_path: Path) -> None:
    """With a rendezvous port, LocalJob plays the chart's rendezvous Deployment: the service (its command
    derived from the pods' launcher options) answers before the first pod starts, every pod is told it
    is a client (is_host=0), and a killed service is replaced while the job runs."""
    from trainer.launcher.supervise import read_epoch

    port = free_port()
    probe = (
        "import json, socket, sys, time\ns = socket.socket()\n"
        f"up = s.connect_ex(('127.0.0.1', {port})) == 0\n"
        "open(sys.argv[1], 'w').write(json.dumps([up, sys.argv[2:]]))\ntime.sleep(600)\n"
    )
    launcher_options = [
        "--nnodes=2:2",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        "--rdzv-id=lj",
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    specs = [
        PodSpec(
            f"pod-{i}",
            [
                sys.executable,
                "-c",
                probe,
                str(tmp_path / f"t{i}"),
                *launcher_options,
                "--rdzv-conf=join_timeout=9",
            ],
            env,
            tmp_path / f"{i}.log",
        )
        for i in range(2)
    ]
    with LocalJob(specs, host_port=port, rendezvous_restart_delay_s=0.1) as job:
        job.start()
        for i in range(2):
            up, args = json.loads(_wait_for(tmp_path / f"t{i}"))
            assert up, "the service was not listening when the pod started"
            assert "--rdzv-conf=join_timeout=9,is_host=0" in args
        first = read_epoch(f"127.0.0.1:{port}")
        assert first is not None
        job.kill_rendezvous()
        deadline = time.monotonic() + 60
        while (epoch := read_epoch(f"127.0.0.1:{port}", timeout_s=0.5)) in (None, first):
            assert time.monotonic() < deadline, "the service was not replaced"
            job.poll()
            time.sleep(0.1)
        assert job.rendezvous_starts == 2 and epoch != first


def test_invalid_job_configuration_names_the_field(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="pods"):
        LocalJob([])
    spec = PodSpec("p", [sys.executable, "-c", "pass"], {}, tmp_path / "p.log")
    with pytest.raises(ValueError, match="backoff_limit"):
        LocalJob([spec], backoff_limit=-1)


def test_command_line_runs_pods_and_replaces_a_killed_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tools.localpods import main

    # Every index sleeps on its first attempt and exits 0 on its second: both are killed (after 2 and
    # 2.5 s) and replaced; backoff_limit 0 holds because kills are disruptions, not failures.
    argv = ["--pods", "2", "--log-dir", str(tmp_path / "logs"), "--backoff-limit", "0", "--timeout", "60"]
    argv += ["--kill", "0@2", "--kill", "1@2.5"]
    command = [sys.executable, "-c", SCRIPTED, "{index}", "sleep,0", str(tmp_path)]
    assert main([*argv, "--", *command]) == 0
    out = capsys.readouterr().out
    assert "pod_kill {'index': 0" in out and "'reason': 'disrupted'" in out and "job: succeeded" in out
    assert (tmp_path / "attempts-0").read_text() == "xx" and (tmp_path / "attempts-1").read_text() == "xx"
    with pytest.raises(SystemExit):
        main(["--kill", "5@1", "--", "true"])
