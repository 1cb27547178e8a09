"""The health daemon's settings: one frozen dataclass, a docstring per field, the command line built from
it (trainer/config/settings.py), errors that name the option. The chart renders them from its
`nodeHealth*` values (k8s/values.yaml) in the sidecar's arguments."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

from trainer.config.settings import ConfigError, add_arguments, check, parsed, setting

COMPONENT = "health"


@dataclass(frozen=True)
class HealthConfig:
    """Where the daemon listens and what it checks on each request."""

    socket: Path = setting("--socket", "Unix socket to serve on", kind=Path, required=True)
    """The socket NVRx's launcher is given as `--ft-node-health-check-endpoint` (its client speaks Unix
    sockets only). Its directory is created 0700 if missing; the socket is made 0600."""
    storage_path: Path | None = setting(
        "--storage-path", "shared file system to write, read back and remove a probe file in", default=None,
        kind=Path,
    )  # fmt: skip
    """A directory on the FSx mount (the chart gives the run's output directory), made if missing. None:
    the storage check is skipped."""
    storage_deadline_s: float = setting(
        "--storage-deadline", "seconds the storage probe may take", default=10.0, above=0, unit=" seconds"
    )
    """A probe that has not written, read back and removed its file by then fails the check. A hung mount
    blocks the probe's thread in the kernel; while it stays blocked, every later request fails at once
    instead of starting another thread that would block too."""
    nvme_path: Path | None = setting(
        "--nvme-path", "node-local NVMe directory whose free space is checked", default=None, kind=Path
    )
    """The node-local checkpoint tier's mount. None: the free-space check is skipped."""
    nvme_min_free_gib: float = setting(
        "--nvme-min-free-gib", "least free space on --nvme-path, GiB", default=1.0, low=0, unit=" GiB"
    )
    """Below this the node cannot hold its node-local checkpoint: the check fails."""
    gpus: int = setting("--gpus", "GPUs nvidia-smi must list (0: any number)", default=0, low=0)
    """The pod's GPU count. nvidia-smi listing fewer, or failing, fails the device check; without
    nvidia-smi in the container the check is skipped with that reason."""
    efa_devices: int = setting(
        "--efa-devices", "EFA devices the node must have (0: no EFA check)", default=0, low=0
    )
    """The pod's EFA device count: `fi_info -p efa` must list the provider. Skipped with its reason when
    it is 0, when fi_info is absent, or when no EFA device is visible in this container."""
    tool_timeout_s: float = setting(
        "--tool-timeout", "seconds nvidia-smi or fi_info may take", default=20.0, above=0, unit=" seconds"
    )
    """A device tool still running after this fails its check (a wedged driver answers slowly or never)."""

    def __post_init__(self) -> None:
        check(self)
        for name, path in (("storage_path", self.storage_path), ("nvme_path", self.nvme_path)):
            if path is not None and not path.is_absolute():
                raise ConfigError(name, f"must be an absolute path, got {str(path)!r}")
        if not self.socket.is_absolute():
            raise ConfigError("socket", f"must be an absolute path, got {str(self.socket)!r}")
        # sun_path holds 108 bytes on Linux, the terminating NUL included.
        if len(str(self.socket).encode()) > 107:
            raise ConfigError(
                "socket", f"must be at most 107 bytes (a Unix socket's path), got {self.socket}"
            )


def add_health_arguments(parser: argparse.ArgumentParser) -> None:
    add_arguments(parser, COMPONENT, HealthConfig)


def health_config(args: argparse.Namespace) -> HealthConfig:
    return HealthConfig(**parsed(args, COMPONENT, HealthConfig))
