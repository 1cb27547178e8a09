"""Container states and the pod status a kubelet reports, as the API's JSON (camelCase dicts).

Exit codes follow containerd's: a process killed by signal N exits 128 + N (SIGKILL: 137); a command
that cannot be started is `StartError` with exit code 128.
"""

from __future__ import annotations

import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tools.kubelet.nodes import now_iso

IMAGE_ID = "process://tools/kubelet"
START_ERROR_EXIT = 128


def exit_code(returncode: int) -> int:
    """A process's return code as a container's exit code (128 + signal for a killed process)."""
    return 128 - returncode if returncode < 0 else returncode


def waiting(reason: str, message: str = "") -> dict[str, Any]:
    return {"waiting": {"reason": reason, **({"message": message} if message else {})}}


def running(started_at: str) -> dict[str, Any]:
    return {"running": {"startedAt": started_at}}


def terminated(code: int, started_at: str, reason: str | None = None, message: str = "") -> dict[str, Any]:
    state: dict[str, Any] = {
        "exitCode": code,
        "reason": reason or ("Completed" if code == 0 else "Error"),
        "startedAt": started_at,
        "finishedAt": now_iso(),
    }
    if code > 128 and code - 128 in signal.valid_signals():
        state["signal"] = code - 128
    if message:
        state["message"] = message
    return {"terminated": state}


@dataclass
class ContainerState:
    """What the kubelet knows of one container: its state now, the one before, its restarts."""

    name: str
    image: str
    state: dict[str, Any] = field(default_factory=lambda: waiting("PodInitializing"))
    last_state: dict[str, Any] = field(default_factory=dict)
    restart_count: int = 0
    ready: bool = False
    pid: int | None = None

    @property
    def exit_code(self) -> int | None:
        term = self.state.get("terminated")
        return None if term is None else int(term["exitCode"])

    def as_status(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "name": self.name,
            "image": self.image,
            "imageID": IMAGE_ID,
            "ready": self.ready,
            "started": "running" in self.state,
            "restartCount": self.restart_count,
            "state": self.state,
            "lastState": self.last_state,
        }
        if self.pid is not None:
            out["containerID"] = f"process://{self.pid}"
        return out


def condition(kind: str, ok: bool, reason: str = "", message: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {"type": kind, "status": "True" if ok else "False", "lastTransitionTime": now_iso()}
    if reason:
        out["reason"] = reason
    if message:
        out["message"] = message
    return out


def pod_status(
    *,
    phase: str,
    start_time: str,
    init: Sequence[ContainerState],
    main: Sequence[ContainerState],
    initialized: bool,
    extra_conditions: Sequence[Mapping[str, Any]] = (),
    host_ip: str = "127.0.0.1",
    pod_ip: str = "127.0.0.1",
    reason: str = "",
    message: str = "",
) -> dict[str, Any]:
    ready = phase == "Running" and all(c.ready for c in main)
    status: dict[str, Any] = {
        "phase": phase,
        "hostIP": host_ip,
        "hostIPs": [{"ip": host_ip}],
        "podIP": pod_ip,
        "podIPs": [{"ip": pod_ip}],
        "startTime": start_time,
        "conditions": [
            condition("PodReadyToStartContainers", phase in ("Pending", "Running")),
            condition("Initialized", initialized, "" if initialized else "ContainersNotInitialized"),
            condition("ContainersReady", ready, "" if ready else "ContainersNotReady"),
            condition(
                "Ready",
                ready,
                "" if ready else ("PodCompleted" if phase == "Succeeded" else "ContainersNotReady"),
            ),
            *extra_conditions,
        ],
        "containerStatuses": [c.as_status() for c in main],
    }
    if init:
        status["initContainerStatuses"] = [c.as_status() for c in init]
    if reason:
        status["reason"] = reason
    if message:
        status["message"] = message
    return status


def same_status(a: Mapping[str, Any] | None, b: Mapping[str, Any]) -> bool:
    """Equal but for transition times (posting only changes keeps a 2-core API server quiet)."""

    def strip(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k not in ("lastTransitionTime", "finishedAt")}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value

    return a is not None and strip(a) == strip(b)
