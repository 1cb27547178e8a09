"""The restore-and-retention half of a CheckpointManager: the committed checkpoints in the directory.

It restores the newest one that loads (resume.py; a failed load is rolled back, so the next candidate,
or a fresh start, begins from exactly the state the caller built), loads a given one (the node-local
tier's restore, trainer/recovery/local_restore.py), and after each commit deletes what retention
(policy.to_delete) lets go: never one that failed to load in this process, which is evidence and must
not push a good one out.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from trainer.checkpoint import layout
from trainer.checkpoint.context import CheckpointContext
from trainer.checkpoint.resume import RestoreResult, restore_newest, try_load
from trainer.state.save_dict import fingerprint

log = logging.getLogger(__name__)


class CommittedCheckpoints:
    """One rank's view of the directory's committed checkpoints (collectives on the manager's group)."""

    def __init__(self, ctx: CheckpointContext) -> None:
        self.ctx = ctx
        self.unloadable: set[str] = set()
        """Committed checkpoints that failed to load in this process (retention keeps them, uncounted)."""

    def restore(self, state: dict[str, Any]) -> RestoreResult:
        """Load the newest committed checkpoint that loads into `state` (see resume.restore_newest)."""
        ctx = self.ctx
        ctx.fingerprint = fingerprint(state)
        return restore_newest(
            state,
            ctx.cfg.dir,
            rank=ctx.rank,
            world_size=ctx.world_size,
            group=ctx.group(),
            model_fingerprint=ctx.fingerprint,
            unloadable=self.unloadable,
            key=ctx.key,
        )

    def load_from(
        self, path: Path, state: dict[str, Any], planner: Any = None, *, metadata_sha256: str | None = None
    ) -> str | None:
        """Load the checkpoint in `path` into `state` (a collective): None, or the error every rank got."""
        ctx = self.ctx
        return try_load(
            path, state, ctx.rank, ctx.world_size, ctx.group(), planner, metadata_sha256=metadata_sha256
        )

    def retain(self, just_committed: Path) -> list[Path]:
        """Rank 0, after a commit: delete what retention lets go; returns the deleted directories."""
        ctx = self.ctx
        assert ctx.fingerprint is not None
        deleted = layout.apply_retention(
            ctx.cfg.dir,
            ctx.cfg.keep_latest,
            just_committed=just_committed,
            fingerprint=ctx.fingerprint,
            unloadable=self.unloadable,
            lineage=ctx.lineage,
        )
        log.debug("retention deleted %s", [str(d) for d in deleted])
        return deleted

    def latest_path(self) -> Path | None:
        """The newest committed checkpoint directory (not verified), or None."""
        candidates, _ = layout.scan(self.ctx.cfg.dir)
        return candidates[0].path if candidates else None
