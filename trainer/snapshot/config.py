"""Snapshot options (no torch import: `--check-config` validates them before any process starts)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

DEFAULT_DIR = Path("/dev/shm/trainer-snapshots")


@dataclass(frozen=True)
class SnapshotConfig:
    interval_steps: int = 0
    """Snapshot every this many steps into host memory; 0 turns snapshots off."""
    dir: Path = DEFAULT_DIR
    """Where the slots live: a memory-backed filesystem (the pod's /dev/shm) so they outlive the
    worker process yet cost no disk. One directory per node; files are named by global rank."""
    replication: bool = True
    """Also keep each snapshot on a rank of the next node (trainer/snapshot/replica.py), so a lost node's
    state survives; needs two nodes (off with one) and the memory of three more copies per rank."""

    @property
    def enabled(self) -> bool:
        return self.interval_steps > 0

    def due(self, step: int) -> bool:
        """Snapshot after step s (0-based) when (s + 1) is a multiple of the interval."""
        return self.enabled and (step + 1) % self.interval_steps == 0


def run_fingerprint(identity: dict[str, object]) -> str:
    """A short id of what makes two runs the same trajectory; a snapshot is only restored into its own.

    `identity` holds the values that decide the state (model, data, seed, batch, lr, checkpoint dir).
    """
    text = json.dumps(identity, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]
