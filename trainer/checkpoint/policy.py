"""Checkpoint policy as small pure functions: when a pending save is polled, and what retention may
delete (which steps save is trainer/state/cadence.py's, a rule snapshots share). No I/O and no
collectives here, so each rule is tested on its own."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

POLL_MAX_GAP = 16
"""Most steps between two cross-rank polls of a pending save (see `poll_due`)."""


def poll_due(calls: int) -> bool:
    """Whether the `calls`-th non-blocking finalize of a pending save (1 = the step after the save)
    asks every rank whether the write is done.

    That question is a collective, so it must be asked at the same calls on every rank: a count, never
    a clock. Asking at calls 1, 2, 4, 8, 16, then every POLL_MAX_GAP calls keeps a short write's commit
    prompt and costs about log2(steps) + steps / POLL_MAX_GAP collectives per save instead of one per
    step; a commit is at most POLL_MAX_GAP steps late (the next save commits the previous one anyway).
    """
    if calls < 1:
        return False
    if calls <= POLL_MAX_GAP:
        return calls & (calls - 1) == 0
    return calls % POLL_MAX_GAP == 0


@dataclass(frozen=True)
class Kept:
    """One committed checkpoint as retention sees it."""

    step: int
    path: Path
    ours: bool
    """Its manifest names this run's model fingerprint (else retention never touches it)."""
    loadable: bool
    """It passed the manifest check and, if this process tried to load it, loaded."""


def to_delete(checkpoints: Iterable[Kept], just_committed: Path, keep: int) -> list[Path]:
    """Retention: keep the just-committed checkpoint and the newest keep - 1 other loadable ones of this
    model; delete the other loadable ones of this model.

    Never deleted: the checkpoint just committed (whatever its step number: a run that resumed from an
    older checkpoint commits below a foreign or broken newer one), checkpoints that are not provably this
    model's (another preset, an unreadable manifest), and checkpoints that do not load (not counted among
    the kept either: they are evidence, and a broken checkpoint must not push a good one out).
    """
    others = sorted(
        (c for c in checkpoints if c.ours and c.loadable and c.path != just_committed),
        key=lambda c: c.step,
        reverse=True,
    )
    return [c.path for c in others[max(keep - 1, 0) :]]
