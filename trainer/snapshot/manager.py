"""What the training loop calls: snapshot after a step, get ready for the restore before the first step
(the restore itself is trainer/recovery/restore.py `restore_attempt`), clean up at the end.

One `Snapshots` object per process (built by `Snapshots.for_run`, held by trainer.runtime.train.Trainer), so
an in-process restart (tier 1) finds the snapshot its previous iteration wrote still mapped (`memory`), and
a restarted worker (tier 2) finds it in /dev/shm (`shm`). With two or more nodes each snapshot is also
replicated to a rank of the next node (`peer`, trainer/snapshot/replica.py), which is where a replaced
node's ranks restore from.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from trainer.events import spans
from trainer.snapshot.budget import adamw_estimate, check_fits, replica_limit
from trainer.snapshot.config import SnapshotConfig, run_fingerprint
from trainer.snapshot.replica import PeerReplicas
from trainer.snapshot.replica_net import local_address
from trainer.snapshot.ring import Ring
from trainer.snapshot.store import Reusable, SnapshotStore, WriteResult
from trainer.state.plan import SavePlan

if TYPE_CHECKING:
    from trainer.config.train_config import TrainConfig

log = logging.getLogger(__name__)


class Snapshots:
    """Snapshot policy of one process; a disabled config makes every call a no-op but `before_restore`."""

    def __init__(self, cfg: SnapshotConfig, *, rank: int, world_size: int, fingerprint: str) -> None:
        self.cfg, self.rank = cfg, rank
        self.local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        self.store = (
            SnapshotStore(cfg.dir, rank=rank, world_size=world_size, fingerprint=fingerprint)
            if cfg.enabled
            else None
        )
        self.peers = self._peers(world_size) if self.store is not None and cfg.replication else None
        self._checked_bytes = 0
        self.plan = SavePlan(rank)
        """The save dict each snapshot copies, kept within an attempt (trainer/state/plan.py)."""

    @classmethod
    def for_run(cls, cfg: TrainConfig, *, rank: int, world_size: int) -> Snapshots:
        """The snapshots of this run: `cfg.snapshot`, fingerprinted by what decides the trajectory."""
        return cls(cfg.snapshot, rank=rank, world_size=world_size, fingerprint=fingerprint_of(cfg))

    def _peers(self, world_size: int) -> PeerReplicas | None:
        assert self.store is not None
        try:
            ring = Ring(world_size, self.local_ranks)
        except ValueError as exc:
            log.warning("peer replication off: %s", exc)
            return None
        if not ring.enabled:
            if self.rank == 0:
                log.info("peer replication off: one node (no peer to keep a replica)")
            return None
        return PeerReplicas(self.store, ring, host=local_address(os.environ.get("MASTER_ADDR")))

    def check_budget(self, model: torch.nn.Module) -> None:
        """Before the first step: do the snapshots (own and peer copies) of every local rank fit?
        (estimated from the parameters)."""
        if self.store is None:
            return
        params = list(model.parameters())
        local = [p.to_local() if hasattr(p, "to_local") else p for p in params]
        estimate = adamw_estimate(sum(t.numel() * t.element_size() for t in local), len(local))
        check_fits(self.cfg.dir, estimate, local_ranks=self.local_ranks, replicated=self.peers is not None)
        if self.peers is not None:
            self.peers.set_limit(replica_limit(max(estimate, self._checked_bytes)))
        if local and local[0].is_cuda:
            self.store.pin()

    def before_restore(self, state: dict[str, Any], events: Any) -> None:
        """A new attempt, before the restore agreement (trainer/recovery/restore.py `restore_attempt`):
        nothing of the last attempt's objects is reused (or kept alive), the budget is checked against
        this attempt's model, and no replica of a (possibly abandoned) past lands after the agreement."""
        self.plan.reset()
        self.check_budget(state["model"])
        if self.peers is not None:
            self.peers.events = events
            self.peers.quiesce()
        spans.mark("budget")

    def after_step(self, step: int, state: dict[str, Any]) -> WriteResult | None:
        """Snapshot `state` (labelled `step`, the last step it includes) when the interval says so.

        blocked_s counts everything the loop waits for here: building (or refreshing) the save dict, the
        wait for the previous commit and the peers, the copy. The result's `reusable` offers the snapshot
        to a durable save of the same step (the loop passes it on; nothing here keeps it)."""
        if self.store is None or not self.cfg.due(step):
            return None
        t_build = time.perf_counter()
        save_dict, flat = self.plan.build(state)
        built = time.perf_counter() - t_build  # the loop waits for it too: part of what it is blocked
        waited = 0.0
        if self.peers is not None:
            t0 = time.perf_counter()
            self.store.wait()  # the previous commit, so that the peers know which slot is newest
            self.peers.before_write()  # normally 0: the slot to overwrite is not being sent
            waited = time.perf_counter() - t0
        result = self.store.write(step, save_dict, flat=flat)
        reusable = Reusable(
            self.store, self.store.last_slot, step, self.store.pending_commit, save_dict, flat.plan
        )
        result = dataclasses.replace(
            result,
            blocked_s=result.blocked_s + waited + built,
            wait_s=result.wait_s + waited,
            reusable=reusable,
        )
        if result.bytes > self._checked_bytes:  # the exact size, once known (and if it ever grows)
            check_fits(
                self.cfg.dir, result.bytes, local_ranks=self.local_ranks, replicated=self.peers is not None
            )
            self._checked_bytes = result.bytes
            if self.peers is not None:
                self.peers.set_limit(replica_limit(result.bytes))
        return result

    def finish(self) -> None:
        """The run completed: free the pod's memory (a later run must not resume a finished one)."""
        self.plan.reset()
        if self.peers is not None:
            self.peers.quiesce()
            self.peers.close(remove=True)
            self.peers = None
        if self.store is not None:
            self.store.remove()

    def close(self) -> None:
        """Stop replicating and unmap, leaving every snapshot and replica in place (as a process that
        ends without completing does)."""
        self.plan.reset()
        if self.peers is not None:
            self.peers.close()
            self.peers = None
        if self.store is not None:
            self.store.close()

    @property
    def directory(self) -> Path:
        return self.cfg.dir


def fingerprint_of(cfg: TrainConfig) -> str:
    """What makes a snapshot this run's: the values that decide the trajectory, and its checkpoint dir."""
    return run_fingerprint(
        {
            "seed": cfg.run.seed,
            "ckpt_dir": str(cfg.ckpt.dir.resolve()),
            "entrypoint": cfg.run.entrypoint,
            "entry_args": list(cfg.run.entry_args),
        }
    )
