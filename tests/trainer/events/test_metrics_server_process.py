"""The metrics endpoint's child process: a taken port is the parent's OSError, and the child never outlives
its training process (it would hold the port against the restarted worker)."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT
from trainer.events.metrics_server import MetricsServer

PARENT = """
import sys
from trainer.events.metrics_server import MetricsServer
server = MetricsServer(sys.argv[1], 0, rank=0, addr="127.0.0.1")
print(server._proc.pid, flush=True)
sys.stdin.read()  # until killed
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as fh:  # a zombie has exited
        return fh.read().split(")")[-1].split()[0] != "Z"


def test_a_taken_port_is_the_parents_oserror(tmp_path: Path) -> None:
    first = MetricsServer(tmp_path, 0, rank=0, addr="127.0.0.1")
    try:
        with pytest.raises(OSError) as info:
            MetricsServer(tmp_path, first.port, rank=0, addr="127.0.0.1")
        assert info.value.errno == errno.EADDRINUSE
    finally:
        first.close()
    assert first._proc.returncode == 0  # closing its stdin ended it cleanly


def test_the_child_exits_when_its_training_process_is_killed(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, str(tmp_path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        text=True, env=env,
    )  # fmt: skip
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    assert _alive(child)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(child), "the endpoint process outlived its killed parent"


def _scrape(port: int) -> int:
    import urllib.request

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return int(response.status)


def test_a_killed_child_is_started_again_on_the_same_port(tmp_path: Path) -> None:
    server = MetricsServer(tmp_path, 0, rank=0, addr="127.0.0.1")
    try:
        first = server._proc.pid
        assert _scrape(server.port) == 200
        os.kill(first, signal.SIGKILL)  # from outside: the training process sent nothing
        deadline = time.monotonic() + 30
        while (server._proc.pid == first or server.restarts == 0) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.restarts == 1 and server._proc.pid != first
        assert _scrape(server.port) == 200, "the endpoint is back on the port the scraper knows"
    finally:
        server.close()
    assert server._proc.returncode == 0 and server.restarts == 1, "a closed handle is not restarted"


PARENT_ON_PORT = """
import sys
from trainer.events.metrics_server import MetricsServer
server = MetricsServer(sys.argv[1], int(sys.argv[2]), rank=0, addr="0.0.0.0")
print(server.port, flush=True)
sys.stdin.read()  # until killed
"""


def test_a_worker_restarted_at_once_gets_the_port_its_killed_predecessor_served(tmp_path: Path) -> None:
    """A worker SIGKILLed and started again from the warm zygote checks the metrics port while the dead
    worker's endpoint process may still hold it: the check waits for the release (a ConfigError there is
    exit 93, the whole job lost to a race). A port taken for good is still refused, naming the field."""
    from tests.helpers import free_port
    from trainer.config.train_config import ConfigError
    from trainer.runtime.preflight import check_metrics_port, open_metrics_server

    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT_ON_PORT, str(tmp_path), str(port)], stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip
    assert parent.stdout is not None
    assert int(parent.stdout.readline()) == port
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    check_metrics_port(port, {}, try_bind=True)  # at once: the endpoint process is still exiting
    server = open_metrics_server(tmp_path, port, rank=0, local_rank=0)
    assert server is not None and server.port == port
    try:
        started = time.monotonic()
        with pytest.raises(ConfigError, match="already in use") as info:
            check_metrics_port(port, {}, try_bind=True, wait_s=0.5)
        assert info.value.field == "metrics_port"
        assert time.monotonic() - started >= 0.5
    finally:
        server.close()
