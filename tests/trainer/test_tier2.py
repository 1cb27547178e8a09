"""Tier 2: heartbeats, the SIGTERM path of survivors, and hard faults recovered through ft_launcher."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.conftest import free_port
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
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
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
