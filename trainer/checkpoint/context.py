"""What the two halves of one rank's CheckpointManager share: the save-and-commit side (saver.py) and the
restore-and-retention side (committed.py) act on the same directory, with the same key, lease and
lineage, over the same process groups, for the same model (its fingerprint, known at the first save
or restore)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta

import torch.distributed as dist

from trainer.checkpoint.config import CheckpointConfig
from trainer.checkpoint.lease import Lease
from trainer.checkpoint.local_tier import LocalTier

log = logging.getLogger(__name__)


@dataclass
class CheckpointContext:
    cfg: CheckpointConfig
    rank: int
    world_size: int
    key: bytes
    """The checkpoint key that signs and verifies manifests and seals (docs/design.md Contract 5)."""
    lease: Lease
    """The directory's claim by this job (rank 0 holds and refreshes it)."""
    local: LocalTier | None
    """The node-local tier (cfg.local_dir): written first, sealed, drained to cfg.dir (local_tier.py)."""
    pg: dist.ProcessGroup | None
    """The manager's own gloo group: its agreements never interleave with the training group's."""
    write_pg: dist.ProcessGroup | None
    """The writer's group (see `groups`); None once closed."""
    owns_pg: bool
    lineage: str = ""
    """The lineage this job continues (lease.py), learned from rank 0's claim."""
    fingerprint: str | None = None
    """This model's fingerprint (save_dict.fingerprint), taken at the first save or restore."""

    @staticmethod
    def groups(
        cfg: CheckpointConfig, process_group: dist.ProcessGroup | None
    ) -> tuple[dist.ProcessGroup, dist.ProcessGroup]:
        """The manager's group (the caller's, else a new gloo group) and the writer's own.

        The writer gets a group of its own: torch-async runs DCP's collectives (planning, metadata) in a
        background thread, and two threads issuing collectives on one gloo group pair them up in a
        different order on different ranks (a finalize all_reduce met a peer's planning gather and both
        timed out, with no fault at all). Its timeout is the write's: DCP gathers the write results
        after each rank's write, so a rank whose write is done waits there for the slowest peer's."""
        timeout = timedelta(seconds=cfg.collective_timeout_s)
        pg = process_group or dist.new_group(backend="gloo", timeout=timeout)
        write_pg = dist.new_group(
            backend="gloo", timeout=timedelta(seconds=max(cfg.collective_timeout_s, cfg.write_timeout_s))
        )
        return pg, write_pg

    def group(self) -> dist.ProcessGroup:
        if self.pg is None:
            raise RuntimeError("CheckpointManager is closed")
        return self.pg

    def writer_group(self) -> dist.ProcessGroup:
        if self.write_pg is None:
            raise RuntimeError("CheckpointManager is closed")
        return self.write_pg

    def global_rank0(self) -> int:
        return dist.get_global_rank(self.group(), 0)

    def destroy_groups(self) -> None:
        groups = [self.write_pg] + ([self.pg] if self.owns_pg else [])
        for group in groups:
            if group is None:
                continue
            try:
                dist.destroy_process_group(group)
            except Exception as exc:  # the default group may be gone already
                log.debug("destroying a checkpoint group: %s", exc)
        self.pg = self.write_pg = None
