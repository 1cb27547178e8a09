"""NVRx's node health protocol served on a Unix socket: `nvhcd.HealthCheckService.RunHealthCheck`
(nvidia_resiliency_ext/shared_utils/proto/nvhcd.proto, whose generated modules NVRx ships and this
imports), as ft_launcher calls it before it joins each rendezvous round
(`--ft-node-health-check-endpoint`).

What NVRx 0.7's client (shared_utils/health_check.py `NodeHealthCheck`) does with the reply: `success`
false refuses the node; otherwise `output` is parsed as JSON and `fail_count` > 0 refuses it; anything
else (no socket at launcher start, a connection error, unparsable output) lets the node join. So this
answers `success` = no check failed, and `output` with `fail_count` (trainer/health/report.py).

Node-local and unauthenticated on purpose: NVRx's client opens an insecure channel to a Unix socket and
sends no credentials, so the socket's file permissions are the access control. It is created 0600 (umask
077 while binding) in a directory only the pod's containers mount (an emptyDir), and the request's
arguments are recorded, never executed: a caller can only ask for a check round.
"""

from __future__ import annotations

import os
import stat
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc

from trainer.health import checks
from trainer.health.config import HealthConfig
from trainer.health.report import report_json

Check = Callable[[], checks.CheckResult]


def node_checks(cfg: HealthConfig) -> list[Check]:
    """The checks of one round, in the order they run (the cheap local ones first)."""
    storage = checks.StorageProbe(cfg.storage_path, cfg.storage_deadline_s)
    return [
        lambda: checks.nvme_free(cfg.nvme_path, cfg.nvme_min_free_gib),
        storage,
        lambda: checks.gpus(cfg.gpus, cfg.tool_timeout_s),
        lambda: checks.efa(cfg.efa_devices, cfg.tool_timeout_s),
    ]


def _protocol() -> tuple[Any, Any]:
    """NVRx's generated message and service modules."""
    from nvidia_resiliency_ext.shared_utils.proto import nvhcd_pb2, nvhcd_pb2_grpc

    return nvhcd_pb2, nvhcd_pb2_grpc


class HealthService:
    """The servicer: one check round per request, one round at a time (a second caller waits for the
    lock rather than doubling the probes a slow file system already struggles with)."""

    def __init__(self, round_checks: Sequence[Check], log: Callable[[str], None] | None = None) -> None:
        self._checks = list(round_checks)
        self._lock = threading.Lock()
        self._log = log or (lambda line: print(line, file=sys.stderr, flush=True))
        self._pb2, _ = _protocol()

    def run_round(self, args: Sequence[str] = ()) -> tuple[int, str]:
        with self._lock:
            results = [check() for check in self._checks]
        output = report_json(results, args)
        failed = sum(r.status == "fail" for r in results)
        self._log(f"trainer.health: {output}")
        return failed, output

    def RunHealthCheck(self, request: Any, context: Any) -> Any:
        failed, output = self.run_round(list(request.args))
        return self._pb2.HealthCheckResponse(success=failed == 0, exit_code=1 if failed else 0, output=output)


def prepare_socket(path: Path) -> None:
    """A private directory for the socket (0700: an emptyDir mount point comes world-writable), and no
    stale socket of an earlier run in the way."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise FileExistsError(f"{path} exists and is not a socket")
    path.unlink()


def serve(cfg: HealthConfig, round_checks: Sequence[Check] | None = None) -> grpc.Server:
    """Start serving on cfg.socket (0600); the caller stops the returned server."""
    _, pb2_grpc = _protocol()
    prepare_socket(cfg.socket)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="health"))
    service = HealthService(node_checks(cfg) if round_checks is None else round_checks)
    pb2_grpc.add_HealthCheckServiceServicer_to_server(service, server)
    previous = os.umask(0o077)
    try:
        if server.add_insecure_port(f"unix:{cfg.socket}") == 0:
            raise OSError(f"cannot listen on {cfg.socket}")
        server.start()
    finally:
        os.umask(previous)
    os.chmod(cfg.socket, 0o600)
    return server
