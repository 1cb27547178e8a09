"""The hardening every workload the stacks apply shares with the trainer's pods: non-root,
RuntimeDefault seccomp, read-only root file system, no privilege escalation, no capabilities."""

from __future__ import annotations

from typing import Any

NON_ROOT_UID = 65534  # nobody: the images these workloads run need no user of their own


def pod_security_context(uid: int = NON_ROOT_UID) -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": uid,
        "runAsGroup": uid,
        "fsGroup": uid,  # emptyDir volumes are writable by the pod's group
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context() -> dict[str, Any]:
    return {
        "readOnlyRootFilesystem": True,
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "capabilities": {"drop": ["ALL"]},
    }
