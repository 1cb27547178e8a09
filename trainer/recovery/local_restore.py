"""Restore from the node-local tier: the newest locally sealed step that every rank has, agreed first.

Each rank offers its verified local steps (local_tier.LocalTier.offers: seal, model, world size, and the
CRC32 of its files and the .metadata). The steps every rank offers, at least as new as the newest
durable (shared) checkpoint, are candidates, newest first; a candidate is loaded with DCP from the node's
step directory by every rank together, and a failed load (on any rank) is rolled back before the next
candidate, so the caller's fallback begins from the state it built. Restoring a step the shared
directory also holds reads the node's NVMe instead of FSx; restoring a newer one (its drain was cut
short) recomputes fewer steps.

A node's copy holds its own ranks' shard files and the .metadata. DCP stores a value that every rank
holds alike (an optimizer step counter, a param_groups entry) once, in one rank's file, which may be on
another node: `NodeLocalPlanner` reads those from this rank's own copy (`rank<R>.replicated.pt`, sealed
with the step) instead. Anything else missing on the node fails the load, on every rank alike, and the
group falls back to the shared checkpoint.
"""

from __future__ import annotations

import dataclasses
import io
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed._shard._utils import narrow_tensor_by_index
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, ReadItem

from trainer.checkpoint.local_tier import LocalOffer
from trainer.state.save_dict import Rollback, fingerprint

log = logging.getLogger(__name__)


class NodeLocalPlanner(DefaultLoadPlanner):
    """DCP's default load plan, minus the reads from files this node does not have: those values come
    from this rank's sealed copy of the unsharded values (what DCP deduplicated into another rank's file)."""

    def __init__(self, directory: Path, replicated: dict[str, Any]) -> None:
        super().__init__()
        self.directory, self.replicated = Path(directory), replicated

    def create_local_plan(self) -> LoadPlan:
        plan = super().create_local_plan()
        assert self.metadata is not None and self.metadata.storage_data is not None
        here: list[ReadItem] = []
        for item in plan.items:
            stored = self.metadata.storage_data[item.storage_index]
            if (self.directory / stored.relative_path).is_file():
                here.append(item)
                continue
            key = item.dest_index.fqn
            if key not in self.replicated:
                raise FileNotFoundError(f"{key} is in {stored.relative_path}, which this node does not have")
            value = self.replicated[key]
            if item.type == LoadItemType.BYTE_IO:
                buf = io.BytesIO()
                torch.save(value, buf)
                buf.seek(0)
                self.load_bytes(item, buf)
            else:
                target = self.resolve_tensor(item).detach()
                target.copy_(narrow_tensor_by_index(value, item.storage_offsets, item.lengths))
                self.commit_tensor(item, target)
        return dataclasses.replace(plan, items=here)


OFFERED = 3
"""Local steps each rank offers in the agreement (its newest)."""


@dataclass(frozen=True)
class LocalCandidates:
    offers: list[LocalOffer]
    """This rank's verified local steps, newest first."""
    steps: list[int]
    """Steps every rank offers that are at least as new as the durable checkpoint, newest first."""
    refused: list[str]
    """This rank's local steps not offered, with why."""
    damaged: list[tuple[int, str]] = dataclasses.field(default_factory=list)
    """(step, why) of this rank's local steps whose files failed their sealed digests (quarantined)."""

    @property
    def newest(self) -> int:
        return self.steps[0] if self.steps else -1


NONE = LocalCandidates([], [], [])
"""No local step can be restored (none is at least as new as the durable checkpoint on every rank)."""


def newest_sealed(ckpt: Any) -> int:
    """This rank's newest locally sealed step, unverified (-1: none): no file is read but the listing.

    The minimum over the ranks bounds every step `agree` could find (a verified step is a sealed one,
    and every rank must have it), so a restore agreement learns from one integer per rank whether the
    local tier can matter at all before paying for its verification."""
    local = getattr(ckpt.manager, "local", None)
    steps = local.sealed_steps() if local is not None else []
    return steps[0] if steps else -1


def agree(ckpt: Any, state: dict[str, Any], durable: int, device: torch.device) -> LocalCandidates:
    """The local steps every rank can restore (a collective on the default group; every rank calls it,
    with or without a local tier)."""
    local = getattr(ckpt.manager, "local", None)
    offers, refused = local.offers(fingerprint(state)) if local is not None else ([], [])
    damaged: list[tuple[int, str]] = []
    if local is not None:
        damaged, local.damaged = local.damaged, []
    for reason in refused:
        log.warning("local checkpoint not offered: %s", reason)
    mine = [o.step for o in offers][:OFFERED]
    row = torch.tensor(mine + [-1] * (OFFERED - len(mine)), dtype=torch.int64, device=device)
    rows = [torch.empty_like(row) for _ in range(dist.get_world_size())]
    dist.all_gather(rows, row)
    common = set.intersection(*({s for s in r.tolist() if s >= 0} for r in rows))
    return LocalCandidates(
        offers, sorted((s for s in common if s >= durable), reverse=True), refused, damaged
    )


def restore_local(
    ckpt: Any, state: dict[str, Any], candidates: LocalCandidates, *, events: Any, t0: float
) -> tuple[int, str, float] | None:
    """Load the newest agreed local step that loads on every rank: (step, path, seconds) or None.
    Emits the `restore` event (source `local`) on success."""
    rollback = Rollback(state) if candidates.steps else None
    for step in candidates.steps:
        offer = next(o for o in candidates.offers if o.step == step)
        local = ckpt.manager.local
        planner = NodeLocalPlanner(offer.path, local.load_replicated(step))
        error = ckpt.manager.load_from(
            offer.path, state, planner, metadata_sha256=offer.metadata_sha256
        )  # agreed: every rank, same verdict
        if error is None:
            load_s = time.perf_counter() - t0
            events.emit("restore", step=step, path=str(offer.path), load_s=load_s, source="local")
            ckpt.pass_over_incomplete()
            return step, str(offer.path), load_s
        assert rollback is not None
        rollback.restore()
        log.warning("local checkpoint of step %d not restored on every rank: %s", step, error)
        candidates.refused.append(f"local step {step}: {error}")
    return None
