"""The daemon's protocol, asked by NVRx's own client (shared_utils/health_check.py `NodeHealthCheck`,
what ft_launcher calls before each rendezvous round), by NVRx's generated stub for the raw reply, and
by the command line: one healthy and one refused node, the socket's permissions, the startup probe."""

from __future__ import annotations

import json
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from nvidia_resiliency_ext.shared_utils.health_check import NodeHealthCheck
from nvidia_resiliency_ext.shared_utils.proto import nvhcd_pb2, nvhcd_pb2_grpc

from trainer.health.config import HealthConfig
from trainer.health.server import serve


@pytest.fixture
def short_dir() -> Iterator[Path]:
    # A Unix socket's path has at most 107 bytes: pytest's tmp_path can be longer.
    folder = Path(tempfile.mkdtemp(prefix="health-", dir="/tmp"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def served(folder: Path, storage: Path) -> tuple[grpc.Server, Path]:
    """The daemon on folder/run/health.sock; a storage path under a regular file cannot be written."""
    cfg = HealthConfig(socket=folder / "run" / "health.sock", storage_path=storage, nvme_path=folder)
    return serve(cfg), cfg.socket


def test_nvrx_client_lets_a_healthy_node_join(short_dir: Path) -> None:
    server, sock = served(short_dir, short_dir)
    try:
        assert NodeHealthCheck(endpoint=f"unix://{sock}")() is True
        assert NodeHealthCheck(endpoint=str(sock))() is True  # a bare path, as the flag also takes it
    finally:
        server.stop(0)


def test_nvrx_client_refuses_a_node_whose_storage_fails(short_dir: Path) -> None:
    (short_dir / "a-file").write_text("")
    server, sock = served(short_dir, short_dir / "a-file" / "out")
    try:
        assert NodeHealthCheck(endpoint=f"unix://{sock}")() is False
    finally:
        server.stop(0)


def test_the_reply_names_the_failed_check_and_records_the_request(short_dir: Path) -> None:
    (short_dir / "a-file").write_text("")
    server, sock = served(short_dir, short_dir / "a-file" / "out")
    try:
        with grpc.insecure_channel(f"unix://{sock}") as channel:
            stub = nvhcd_pb2_grpc.HealthCheckServiceStub(channel)
            reply = stub.RunHealthCheck(nvhcd_pb2.HealthCheckRequest(args=["--group", "gpu"]), timeout=30)
    finally:
        server.stop(0)
    out = json.loads(reply.output)
    assert (reply.success, reply.exit_code, out["fail_count"]) == (False, 1, 1)
    assert out["failed_checks"][0].startswith("storage: ")
    assert {c["name"]: c["status"] for c in out["checks"]} == {
        "nvme": "pass",
        "storage": "fail",
        "gpu": "skip" if shutil.which("nvidia-smi") is None else out["checks"][2]["status"],
        "efa": "skip",
    }
    assert out["args"] == ["--group", "gpu"]


def test_the_socket_is_private_and_a_stale_one_replaced(short_dir: Path) -> None:
    # What a killed daemon leaves: a socket file nobody listens on.
    (short_dir / "run").mkdir(mode=0o700)
    with socket.socket(socket.AF_UNIX) as stale:
        stale.bind(str(short_dir / "run" / "health.sock"))
    server, sock = served(short_dir, short_dir)
    try:
        assert stat.S_IMODE(sock.stat().st_mode) == 0o600
        assert stat.S_IMODE(sock.parent.stat().st_mode) == 0o700
        assert NodeHealthCheck(endpoint=str(sock))() is True
    finally:
        server.stop(0)
    sock.write_text("not a socket")
    with pytest.raises(FileExistsError):
        served(short_dir, short_dir)


def test_the_command_line_serves_probes_and_refuses_bad_input(short_dir: Path) -> None:
    sock = short_dir / "health.sock"
    probe = [sys.executable, "-m", "trainer.health", "probe", "--socket", str(sock)]
    assert subprocess.run(probe, capture_output=True, check=False).returncode == 1
    bad = subprocess.run(
        [sys.executable, "-m", "trainer.health", "--socket", str(sock), "--storage-deadline=0"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert (bad.returncode, bad.stderr.strip()) == (
        2,
        "config error: storage_deadline: must be > 0 seconds, got 0.0",
    )
    daemon = subprocess.Popen(
        [sys.executable, "-m", "trainer.health", "--socket", str(sock), "--storage-path", str(short_dir)],
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while subprocess.run(probe, capture_output=True, check=False).returncode != 0:
            assert daemon.poll() is None and time.monotonic() < deadline, "the daemon never served"
            time.sleep(0.1)
        assert NodeHealthCheck(endpoint=str(sock))() is True
    finally:
        daemon.terminate()
        assert daemon.wait(10) == 0
    assert not sock.exists()
