"""Do a rank's snapshots and the peer replicas it keeps fit in the pod's /dev/shm? Checked before step 0.

Each rank keeps two slots of its own (double buffering); with peer replication it also keeps two slots
of one rank on the previous node (trainer/snapshot/ring.py) and, while restoring a replaced node, one
snapshot pulled back from its peer. Every local rank of the pod shares the same tmpfs. A snapshot that
does not fit would fail with SIGBUS on the first page the kernel cannot back, in the middle of a step,
on every restart alike: so it is an UnrecoverableError, reported in one line.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from trainer.config.errors import UnrecoverableError
from trainer.snapshot.store import HEADER_BYTES

MiB = 1 << 20
COPIES = 2
"""Slots per rank: the newest snapshot and the one being written."""
PEER_COPIES = COPIES + 1
"""With replication: two slots of the peer's replica, and one replica pulled back at a restore."""
_SLOT_FILES = ("rank*.slot*", "replicas/rank*.slot*", "pulled/rank*.slot*")


def adamw_estimate(param_bytes: int, params: int) -> int:
    """Bytes of one snapshot of parameters + AdamW's two moments + per-parameter step + small state."""
    per_param_overhead = 64 * 3 + 64  # alignment of each tensor, the step counter
    return 3 * param_bytes + params * per_param_overhead + 64 * 1024 + HEADER_BYTES


def copies_per_rank(replicated: bool) -> int:
    return COPIES + (PEER_COPIES if replicated else 0)


def check_fits(directory: Path, bytes_per_copy: int, *, local_ranks: int, replicated: bool = False) -> int:
    """Raise UnrecoverableError if `local_ranks` ranks' slots cannot fit; returns the bytes needed.

    Space already held by slot files in the directory (own, replicas, pulled) counts as available: they
    are resized in place or replaced.
    """
    directory.mkdir(parents=True, exist_ok=True)
    st = os.statvfs(directory)
    available = st.f_bavail * st.f_frsize + _held_bytes(directory)
    copies = copies_per_rank(replicated)
    need = copies * bytes_per_copy * local_ranks
    if need > available:
        what = f"{COPIES} own + {PEER_COPIES} peer replica" if replicated else f"{COPIES}"
        off = (
            "snapshot_interval 0, or peer replication off: snapshot_replication false"
            if replicated
            else ("snapshot_interval 0")
        )
        raise UnrecoverableError(
            "snapshot_dir",
            f"{directory} has {available / MiB:.0f} MiB free, snapshots need {need / MiB:.0f} MiB "
            f"({local_ranks} local ranks x {what} copies x {bytes_per_copy / MiB:.1f} MiB): give the pod "
            f"a larger /dev/shm (chart: shmSize) or turn snapshots off ({off})",
        )
    return need


def _held_bytes(directory: Path) -> int:
    """Bytes of the slot files in `directory` now. The pod's other ranks replace and remove their files
    while this runs (a replica's receive unlinks the slot it replaces), so a file listed and gone by the
    time it is measured is skipped: else that race stops a rank with FileNotFoundError in the middle of
    training, an in-process restart nobody injected."""
    held = 0
    for pattern in _SLOT_FILES:
        for path in directory.glob(pattern):
            try:
                st = path.stat()
            except FileNotFoundError:
                continue
            if stat.S_ISREG(st.st_mode):
                held += st.st_size
    return held


def replica_limit(bytes_per_copy: int) -> int:
    """The largest peer replica a rank accepts, given its own snapshot's size: the ranks of a ring pair
    have the same local rank and shard sizes within a row per tensor of each other (FSDP2's uneven
    last shard), so a quarter and a MiB of slack cover that; anything larger is not a snapshot of this
    job and is refused before a byte of it is allocated."""
    return bytes_per_copy + bytes_per_copy // 4 + MiB
