"""CheckpointManager: atomic, reshardable DCP checkpoints of one rank, composed of two halves over one
shared context (context.py: directory, key, lease, lineage, process groups, the model's fingerprint):

- saver.py, `CheckpointSaver`: save (async per mode), the cross-rank agreement, the atomic commit (and
  with a node-local tier the seal and drain first); its docstring tells the life of one save.
- committed.py, `CommittedCheckpoints`: restore the newest committed checkpoint that loads (resume.py),
  load a given one, retention after each commit, the newest committed path.

The manager claims the directory (lease.py) before either half starts a writer, and is what callers
hold: every call below goes to one half, so a caller never needs to know which.
Collective contract: every rank calls save / maybe_finalize / wait / restore at the same points;
abort / close are local (no collectives: they run in teardown, when peers may be gone). A restore
first finishes a save still pending.
"""

from __future__ import annotations

import functools
import logging
import time
from pathlib import Path
from typing import Any

import torch.distributed as dist

from trainer.checkpoint.committed import CommittedCheckpoints
from trainer.checkpoint.config import CheckpointConfig
from trainer.checkpoint.context import CheckpointContext
from trainer.checkpoint.lease import Lease, job_uid
from trainer.checkpoint.local_tier import LocalTier
from trainer.checkpoint.resume import RestoreResult
from trainer.checkpoint.saver import CheckpointHooks, CheckpointSaver, SaveResult
from trainer.config.errors import UnrecoverableError
from trainer.security.keys import checkpoint_key
from trainer.state import cadence

log = logging.getLogger(__name__)


class CheckpointManager:
    """Atomic, reshardable DCP checkpoints of {"model", "optim", <Stateful>...} for one rank."""

    def __init__(
        self,
        cfg: CheckpointConfig,
        *,
        rank: int,
        world_size: int,
        process_group: dist.ProcessGroup | None = None,
        hooks: CheckpointHooks | None = None,
        events: Any = None,
        commit_in_background: bool = False,
        start_writers_later: bool = False,
    ) -> None:
        """`commit_in_background`: an asynchronous save's agreement, seal and commit run in a thread of
        their own (committer.py) instead of in the caller's maybe_finalize calls; the caller's wait(),
        its next save and restore join that thread. The training loop sets it; maybe_finalize then
        does nothing. `start_writers_later`: NVRx's worker starts at start_writers() (the loop calls it
        after the first step of each attempt), not while the process builds and restores."""
        if not dist.is_initialized():
            raise RuntimeError("CheckpointManager needs an initialized default process group")
        self.cfg, self.rank, self.world_size = cfg, rank, world_size
        self.hooks = hooks or CheckpointHooks()
        self.events = events
        local = (
            LocalTier(cfg.local_dir, rank=rank, world_size=world_size, keep=cfg.keep_latest)
            if cfg.local_dir is not None
            else None
        )
        key = self.key  # read at start: a missing or bad key file stops the run in one line, not every commit
        if local is not None:
            local.key = key  # seals are signed and verified like manifests
        pg, write_pg = CheckpointContext.groups(cfg, process_group)
        if rank == 0:
            cfg.dir.mkdir(parents=True, exist_ok=True)
        self.ctx = CheckpointContext(
            cfg,
            rank,
            world_size,
            key,
            Lease(cfg.dir, job_uid()),
            local,
            pg,
            write_pg,
            owns_pg=process_group is None,
        )
        # Before any step, and before the writers: a directory another live job holds stops the run, and
        # a run that stops here has started no helper process (NVRx's worker and its write-results
        # Manager) that its exit would have to wait for (a fresh-clone `make test` saw a refused job still
        # alive after 120 s, its exit waiting on the Manager's start-up).
        self.ctx.lineage = self._claim()
        self.committed = CommittedCheckpoints(self.ctx)
        self.saver = CheckpointSaver(
            self.ctx,
            hooks=self.hooks,
            events=events,
            retain=self.committed.retain,
            commit_in_background=commit_in_background,
            start_writers_later=start_writers_later,
        )
        if local is not None:
            local.lineage, local.job = self.lineage, self.lease.job
            local.prune_foreign()

    def _claim(self) -> str:
        """Rank 0 claims the directory (lease.py); every rank learns the lineage, or raises the one line
        that names the job holding it."""
        verdict: list[Any] = [None]
        lease = self.lease
        if self.rank == 0:
            try:
                lease.claim()
                lease.start_heartbeat()
                verdict[0] = ("ok", lease.job, lease.lineage)
            except UnrecoverableError as exc:
                verdict[0] = ("refused", exc.why, "")
        dist.broadcast_object_list(verdict, src=self.ctx.global_rank0(), group=self.ctx.group())
        kind, what, lineage = verdict[0]
        if kind != "ok":
            self.ctx.destroy_groups()
            raise UnrecoverableError("ckpt_dir", what)
        lease.job = what
        return str(lineage)

    # ---------------------------------------------------------------------------------- the directory
    @functools.cached_property
    def key(self) -> bytes:
        """The checkpoint key that signs and verifies manifests and seals (docs/design.md Contract 5)."""
        return checkpoint_key(self.cfg.dir)

    @property
    def lease(self) -> Lease:
        return self.ctx.lease

    @property
    def lineage(self) -> str:
        return self.ctx.lineage

    @property
    def local(self) -> LocalTier | None:
        """The node-local tier (cfg.local_dir), or None."""
        return self.ctx.local

    # ------------------------------------------------------------------------------ save (saver.py)
    def should_save(self, step: int, last_step: int = -1) -> bool:
        """cadence.is_due: at the interval, and after the run's last step."""
        return cadence.is_due(step, self.cfg.interval_steps, last_step)

    def start_writers(self) -> None:
        """Start the writers' helper processes (NVRx's worker) if they are not started yet; cheap after."""
        self.saver.start_writers()

    def save(
        self, step: int, state: dict[str, Any], snapshot: Any = None, *, awaited: bool = False
    ) -> SaveResult:
        """Start a checkpoint of `state` labelled `step` (CheckpointSaver.save); how long it blocked."""
        return self.saver.save(step, state, snapshot, awaited=awaited)

    def maybe_finalize(self, blocking: bool = False) -> list[int]:
        """Commit the pending save if every rank finished writing; returns the committed steps."""
        return self.saver.maybe_finalize(blocking)

    def wait(self) -> list[int]:
        """Finish and commit everything pending (bounded by write_timeout_s); returns the committed steps."""
        return self.saver.wait()

    def abort(self) -> None:
        """Abandon the pending save now, on this rank only (no collective)."""
        self.saver.abort()

    @property
    def committed_step(self) -> int:
        """Step of the newest checkpoint this manager committed (-1: none yet)."""
        return self.saver.committed_step

    @property
    def pending_step(self) -> int:
        """Step of the save in flight (-1: none)."""
        return self.saver.pending_step

    @property
    def polls(self) -> int:
        """Cross-rank agreements on pending saves so far (each one all_reduce)."""
        return self.saver.polls

    # ---------------------------------------------------------------- restore (committed.py)
    def restore(self, state: dict[str, Any]) -> RestoreResult:
        """Load the newest committed checkpoint that loads into `state` (see resume.restore_newest),
        after a save still pending is finished."""
        if self.saver.busy:
            self.saver.wait()
        return self.committed.restore(state)

    load_latest = restore  # the earlier name

    def load_from(
        self, path: Path, state: dict[str, Any], planner: Any = None, *, metadata_sha256: str | None = None
    ) -> str | None:
        """Load the checkpoint in `path` into `state` (a collective): None, or the error every rank got."""
        return self.committed.load_from(path, state, planner, metadata_sha256=metadata_sha256)

    def latest_committed_path(self) -> Path | None:
        """The newest committed checkpoint directory (not verified), or None."""
        return self.committed.latest_path()

    # ------------------------------------------------------------------------------------------ close
    def close(self) -> None:
        """Release workers and the group. A save still pending is abandoned (its temp dir is never loaded).

        No collectives here: close runs in teardown after a fault, when peers may be gone.
        """
        t0 = time.perf_counter()
        self.saver.abort()
        self.lease.stop()  # the heartbeat; the lease itself stays until it is released or goes stale
        self.saver.close()
        self.ctx.destroy_groups()
        log.debug("checkpoint manager closed in %.3f s", time.perf_counter() - t0)
