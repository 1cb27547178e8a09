"""Snapshot options (no torch import: `--check-config` validates them before any process starts)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from trainer.config.settings import check, setting
from trainer.state.cadence import is_due

DEFAULT_DIR = Path("/dev/shm/trainer-snapshots")
"""In the pod's memory-backed /dev/shm. The one definition of this path: the chart mounts /dev/shm (a
memory emptyDir) and names no snapshot directory, so a pod uses this default; local runs, several "pods"
on one host, pass `--snapshot-dir` (tools/podcommand.py). tests/trainer/config/test_chart_table.py checks
that the chart's memory-backed mount holds it."""


@dataclass(frozen=True)
class SnapshotConfig:
    interval_steps: int = setting(
        "--snapshot-interval",
        "copy model, optimizer and trainer state into host memory every N steps (0 = off)",
        default=1,
        low=0,
        high=10**12,
        note=" (0 = off)",
        chart="snapshotInterval",
    )
    """Snapshot every this many steps into host memory; 0 turns snapshots off."""
    dir: Path = setting("--snapshot-dir", "memory-backed dir for the snapshots", default=DEFAULT_DIR)
    """Where the slots live: a memory-backed filesystem (the pod's /dev/shm) so they outlive the
    worker process yet cost no disk. One directory per node; files are named by global rank."""
    replication: bool = setting(
        "--snapshot-replication",
        "also keep each snapshot on a rank of the next node (needs 2+ nodes)",
        default=True,
        chart="snapshotReplication",
    )
    """Also keep each snapshot on a rank of the next node (trainer/snapshot/replica.py), so a lost node's
    state survives; needs two nodes (off with one) and the memory of three more copies per rank."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "dir", Path(self.dir))
        check(self)

    @property
    def enabled(self) -> bool:
        return self.interval_steps > 0

    def due(self, step: int) -> bool:
        """Snapshot after step s (0-based) when (s + 1) is a multiple of the interval (no final one)."""
        return is_due(step, self.interval_steps)


def run_fingerprint(identity: dict[str, object]) -> str:
    """A short id of what makes two runs the same trajectory; a snapshot is only restored into its own.

    `identity` holds the values that decide the state (model, data, seed, batch, lr, checkpoint dir).
    """
    text = json.dumps(identity, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]
