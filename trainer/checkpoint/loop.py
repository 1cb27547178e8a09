"""The training loop's side of checkpointing: resume policy, a save at every interval and at the end,
and saves that fail without stopping training.

    ckpt = CheckpointLoop(manager, cfg, events, rank=rank, last_step=steps - 1)
    start = ckpt.restore(state) + 1        # may raise NoLoadableCheckpoint (before any training)
    for step in range(start, steps):
        ...train...
        ckpt.after_step(step, state, snap)  # saves when due (from `snap`, the step's snapshot, if any)
    ckpt.finish(state)                     # the last step is committed before this returns

A failed save (CheckpointWriteError) is a `ckpt_failed` event on rank 0 and training goes on: the next
interval saves again. Restarting would throw away every step since the last commit to retry a write that
a full disk or a storage hiccup fails the same way. `failure_limit` failures in a row stop the run
(CheckpointFailuresExceeded); a commit resets the count. Every rank sees the same failures (the manager
agrees on them), so every rank takes the same branch.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from trainer.checkpoint.config import CheckpointConfig
from trainer.checkpoint.errors import CheckpointFailuresExceeded, CheckpointWriteError, NoLoadableCheckpoint
from trainer.checkpoint.manager import CheckpointManager

log = logging.getLogger(__name__)


class CheckpointLoop:
    """Owns one CheckpointManager for one (re)start of the training loop."""

    def __init__(
        self, manager: CheckpointManager, cfg: CheckpointConfig, events: Any, *, rank: int, last_step: int
    ) -> None:
        self.manager, self.cfg, self.events = manager, cfg, events
        self.rank, self.last_step = rank, last_step
        self.failures = 0
        self.consecutive_failures = 0
        self.restored_step = -1
        self._seen_commit = manager.committed_step

    # --------------------------------------------------------------------------------------- resume
    def restore(self, state: dict[str, Any]) -> int:
        """Load the newest checkpoint that loads; returns its step (-1: none). Emits `ckpt_skipped` (rank 0)
        and `restore`. Raises NoLoadableCheckpoint when committed checkpoints exist, none loads and
        cfg.allow_fresh_start is off: before any training step, so nothing is overwritten."""
        result = self.manager.restore(state)
        if self.rank == 0:
            for skipped in result.skipped:
                self.events.emit("ckpt_skipped", path=skipped.path, reason=skipped.reason)
        if result.step < 0 and result.committed and not self.cfg.allow_fresh_start:
            raise NoLoadableCheckpoint(str(self.cfg.dir), [(s.path, s.reason) for s in result.skipped])
        source = "fsx" if result.step >= 0 else "none"  # Contract 3 (snapshots add memory and shm)
        self.events.emit(
            "restore", step=result.step, path=str(result.path or ""), load_s=result.load_s, source=source
        )
        self.restored_step = result.step
        return result.step

    def pass_over_incomplete(self) -> None:
        """Rank 0: delete the shared directory's temp directories of interrupted saves and report each as
        `ckpt_skipped`, as restore() does; for a resume from another source (no collective)."""
        if self.rank != 0:
            return
        from trainer.checkpoint import layout

        for tmp in layout.scan(self.cfg.dir)[1]:
            layout.discard(tmp)
            reason = "incomplete: never committed (interrupted save)"
            self.events.emit("ckpt_skipped", path=str(tmp), reason=reason)

    # ----------------------------------------------------------------------------------------- steps
    def after_step(self, step: int, state: dict[str, Any], snapshot: Any = None) -> None:
        """Save when policy says so (at the interval and after the last step); else poll a pending save.
        `snapshot`: the snapshot taken at this step boundary (or None); a save reuses it (manager.save).

        The writers' helper processes start here, after the attempt's first step, not with the manager:
        NVRx's worker is a fresh interpreter importing torch (seconds of CPU per rank) and, started with
        the manager, it ran beside the restore of every rank of a restarted job on the same cores (the
        replaced node's ranks took ten times as long to build the model). A save
        due before the worker is up is written in this process (from_snapshot.py's fallback)."""
        self.manager.start_writers()
        if self.manager.should_save(step, self.last_step):
            self._save(step, state, snapshot)
        else:
            self._guard(lambda: self.manager.maybe_finalize(blocking=False))

    def finish(self, state: dict[str, Any]) -> None:
        """Commit the last step (retrying a failed save, up to failure_limit failures in a row)."""
        while max(self.manager.committed_step, self.restored_step) < self.last_step:
            if self.manager.pending_step != self.last_step:
                self._save(self.last_step, state)
            self._guard(self.manager.wait)

    def settle(self) -> None:
        """Wait for a save in flight to commit (or fail): before a restore in the middle of a run (the
        numerical guard's rollback), so the restore's agreement sees it and the replay never saves a
        step again that is already being committed."""
        self._guard(self.manager.wait)

    def close(self) -> None:
        if self.rank == 0 and self.last_step >= 0 and self.manager.committed_step >= self.last_step:
            self.manager.lease.release()  # completed: the directory is free for the next job at once
        self.manager.close()

    def latest_committed_path(self) -> Any:
        return self.manager.latest_committed_path()

    # --------------------------------------------------------------------------------------- helpers
    def _save(self, step: int, state: dict[str, Any], snapshot: Any = None) -> None:
        t0 = time.perf_counter()
        self._guard(self.manager.wait)  # the previous save commits (or fails) first
        waited = time.perf_counter() - t0  # the loop's wait too (a write slower than the interval)
        awaited = step == self.last_step  # finish() waits for it next
        result = self._guard(lambda: self.manager.save(step, state, snapshot, awaited=awaited))
        if result is not None:
            blocked = result.blocked_s + waited
            self.events.emit(
                "ckpt_save", step=step, blocked_s=blocked, mode=self.cfg.mode, bytes=result.bytes
            )

    def _guard(self, fn: Any) -> Any:
        """Run a manager call; a failed save becomes a `ckpt_failed` event instead of an exception."""
        try:
            out = fn()
        except CheckpointWriteError as exc:
            self._failed(exc)
            return None
        if self.manager.committed_step != self._seen_commit:  # a commit ends a run of failures
            self._seen_commit = self.manager.committed_step
            self.consecutive_failures = 0
        return out

    def _failed(self, exc: CheckpointWriteError) -> None:
        if self.manager.committed_step != self._seen_commit:  # committed before this one failed
            self._seen_commit = self.manager.committed_step
            self.consecutive_failures = 0
        self.failures += 1
        self.consecutive_failures += 1
        reason = str(exc)
        log.warning("checkpoint save failed (%d in a row): %s", self.consecutive_failures, reason)
        if self.rank == 0:
            self.events.emit("ckpt_failed", step=exc.step, reason=reason[:2000])
        if self.consecutive_failures >= self.cfg.failure_limit:
            raise CheckpointFailuresExceeded(self.consecutive_failures, reason) from exc
