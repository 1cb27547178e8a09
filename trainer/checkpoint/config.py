"""Checkpoint configuration, validated on construction (errors name the field)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

CkptMode = Literal["nvrx", "torch-async", "sync"]
MODES: tuple[str, ...] = ("nvrx", "torch-async", "sync")


@dataclass(frozen=True)
class CheckpointConfig:
    """Where and how often to checkpoint, and how long any checkpoint wait may block."""

    dir: Path
    """Shared checkpoint directory (FSx on the cluster): committed checkpoints live here."""
    local_dir: Path | None = None
    """Node-local tier (NVMe). Accepted for the pod command's sake; not used yet (see package docstring)."""
    interval_steps: int = 10
    """Save after every step s with (s + 1) % interval_steps == 0 (steps are 0-based)."""
    keep_latest: int = 3
    """Committed checkpoints kept; older ones are deleted after each commit."""
    mode: CkptMode = "nvrx"
    """nvrx: NVRx persistent worker process; torch-async: dcp.async_save (thread); sync: dcp.save."""
    write_timeout_s: float = 600.0
    """Upper bound on any wait for a background write; past it the save fails with CheckpointWriteError."""
    collective_timeout_s: float = 60.0
    """Timeout of the checkpoint's own gloo process group (use the training collective timeout)."""
    verify_checksums: bool = True
    """At resume, check every file's CRC32 against the manifest (reads the checkpoint once, spread over
    ranks); without it only presence and sizes are checked and silently flipped bytes go unnoticed."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "dir", Path(self.dir))
        if self.local_dir is not None:
            object.__setattr__(self, "local_dir", Path(self.local_dir))
            if Path(self.local_dir).resolve() == Path(self.dir).resolve():
                raise ValueError("local_dir: must differ from dir")
        for name in ("interval_steps", "keep_latest"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}: must be an integer >= 1, got {value!r}")
        if self.mode not in MODES:
            raise ValueError(f"mode: must be one of {', '.join(MODES)}, got {self.mode!r}")
        for name in ("write_timeout_s", "collective_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}: must be > 0 seconds, got {getattr(self, name)!r}")
