"""Does a rank's snapshot fit in the pod's memory-backed /dev/shm? Checked before the first step.

Each rank keeps two slots (double buffering); every local rank of the pod shares the same tmpfs. A
snapshot that does not fit would fail with SIGBUS on the first page the kernel cannot back, in the
middle of a step, on every restart alike: so it is an UnrecoverableError, reported in one line.
"""

from __future__ import annotations

import os
from pathlib import Path

from trainer.errors import UnrecoverableError
from trainer.snapshot.store import HEADER_BYTES

MiB = 1 << 20
COPIES = 2
"""Slots per rank: the newest snapshot and the one being written."""


def adamw_estimate(param_bytes: int, params: int) -> int:
    """Bytes of one snapshot of parameters + AdamW's two moments + per-parameter step + small state."""
    per_param_overhead = 64 * 3 + 64  # alignment of each tensor, the step counter
    return 3 * param_bytes + params * per_param_overhead + 64 * 1024 + HEADER_BYTES


def check_fits(directory: Path, bytes_per_copy: int, *, local_ranks: int) -> int:
    """Raise UnrecoverableError if `local_ranks` ranks' slots cannot fit; returns the bytes needed.

    Space already held by slot files in the directory counts as available: they are resized in place.
    """
    directory.mkdir(parents=True, exist_ok=True)
    st = os.statvfs(directory)
    held = sum(p.stat().st_size for p in directory.glob("rank*.slot*") if p.is_file())
    available = st.f_bavail * st.f_frsize + held
    need = COPIES * bytes_per_copy * local_ranks
    if need > available:
        raise UnrecoverableError(
            "snapshot_dir",
            f"{directory} has {available / MiB:.0f} MiB free, snapshots need {need / MiB:.0f} MiB "
            f"({local_ranks} local ranks x {COPIES} copies x {bytes_per_copy / MiB:.1f} MiB): give the pod "
            "a larger /dev/shm (chart: shmSize) or turn snapshots off (snapshot_interval 0)",
        )
    return need
