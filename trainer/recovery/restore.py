"""Where a (re)started rank gets its state: agreed by every rank before any rank loads.

Sources, in the order tried (SOURCES below; Contract 3 lists them as the `restore` event's `source`):
`memory` (this process's own snapshot: tier 1, in-process restart), `shm` (a snapshot left in the pod's
/dev/shm by an earlier worker process: tier 2, worker restart), `peer` (this rank's replica kept by a
rank on another node: a replaced or spare node, whose /dev/shm is empty), `local` (the durable
checkpoint's copy on the node's NVMe, trainer/checkpoint/local_restore.py), the durable checkpoint
(`fsx`), or nothing (`none`, a fresh start). A newer step wins; of one step, the earlier source.

The agreement is one small all_gather on the training group: each rank offers the steps of its verified
snapshots (checksum, run, world size, rank), the replicas it keeps for other ranks (trainer/snapshot/
replica.py) and its newest locally sealed step (unverified: a directory listing), and rank 0 adds the
newest committed durable step. Every rank then restores the newest step that every rank can restore from
memory (its own snapshot, else its peer's replica), if it is at least as new as the durable checkpoint
and as the local one; after loading, one more all_reduce confirms that every rank succeeded. The local
tier is verified (each rank checksums its files, and a second all_gather agrees on the steps,
trainer/checkpoint/local_restore.py) only when a local step could win: when the snapshot step is older
than the oldest of the ranks' newest sealed steps, or no snapshot loads.
If any rank failed (a replica that fails its checksum once pulled, a peer gone meanwhile), that step is
struck off and the group agrees again, down to the durable checkpoint: a rank never resumes at a step
its peers do not.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from trainer.checkpoint import layout, local_restore
from trainer.checkpoint.local_restore import NONE
from trainer.checkpoint.state import apply_filled, build_save_dict
from trainer.events import spans
from trainer.snapshot import codec
from trainer.snapshot.store import Offer, SnapshotStore

if TYPE_CHECKING:
    from trainer.snapshot.replica import PeerReplicas

log = logging.getLogger(__name__)

SOURCES = ("memory", "shm", "peer", "local", "fsx", "none")
"""Where a rank's state comes from, in the order tried: the snapshot tiers (`_snapshot_source`), the
node-local checkpoint (`local_restore`), the durable checkpoint (`ckpt.restore`). Contract 3's `restore`
event `source`."""
SNAPSHOT_SOURCES = SOURCES[:3]
OFFERED = 2
"""Steps each rank offers (one per slot)."""


@dataclass(frozen=True)
class Restored:
    step: int
    """Last step included in the restored state; -1 = nothing restored (fresh start)."""
    source: str
    """One of SOURCES (Contract 3)."""
    path: str
    load_s: float
    skipped: list[Any] = field(default_factory=list)
    """Durable checkpoints passed over (reported by the CheckpointLoop's own events)."""
    refused: list[str] = field(default_factory=list)
    """This rank's snapshots that were not offered, with why."""


def restore(
    store: SnapshotStore | None,
    ckpt: Any,
    state: dict[str, Any],
    *,
    rank: int,
    device: torch.device,
    events: Any,
    peers: PeerReplicas | None = None,
) -> Restored:
    """Restore `state` in place from the newest source every rank has. A collective: all ranks call it.

    `ckpt` is the loop's CheckpointLoop: its `restore` is the durable fallback (it emits that `restore`
    event itself, and applies the resume policy); a snapshot restore emits its own here.
    """
    t0 = time.perf_counter()
    # Each slot's payload is checked by the load that reads it: one slot of the two is loaded.
    offers, rejected = store.offers(verify_payload=False) if store is not None else ([], [])
    refused = [f"slot {r.slot}: {r.reason}" for r in rejected]
    for reason in refused:
        log.warning("snapshot not offered: %s", reason)
    spans.mark("offers")
    durable = _newest_durable_step(ckpt) if rank == 0 else -1
    spans.mark("durable_scan")
    mine = [o.header.step for o in offers][:OFFERED]
    peer_row = peers.offer_row() if peers is not None else []
    own_row = mine + [-1] * (OFFERED - len(mine)) + [durable, local_restore.newest_sealed(ckpt)]
    row = torch.tensor(own_row + peer_row, dtype=torch.int64, device=device)
    rows = [torch.empty_like(row) for _ in range(dist.get_world_size())]
    dist.all_gather(rows, row)
    spans.mark("agree")
    table = [r.tolist() for r in rows]
    durable = int(table[0][OFFERED])
    local_bound = min(int(r[OFFERED + 1]) for r in table)  # no local step every rank has is newer
    has = [{s for s in r[:OFFERED] if s >= 0} for r in table]
    own = [set(steps) for steps in has]
    if peers is not None:  # a step a peer keeps a replica of counts as one the rank has
        for owner, steps in enumerate(peers.learn([r[OFFERED + 2 :] for r in table])):
            has[owner] |= steps
    spans.mark("learn")
    local: local_restore.LocalCandidates | None = None

    def verified_local() -> local_restore.LocalCandidates:
        # The local tier is verified (each rank's files read and checksummed, one more all_gather) only
        # once a local step could win: every rank decides alike, from the table.
        nonlocal local
        if local is None:
            could = local_bound >= max(durable, 0)
            local = local_restore.agree(ckpt, state, durable, device) if could else NONE
            refused.extend(local.refused)
            spans.mark("local_agree")
        return local

    common = set.intersection(*has)
    if peers is not None and any(common - steps for steps in own):
        # A rank will pull from a peer, and a holder serves only once `learn` gave it the channel key:
        # one empty all_reduce lets every rank learn first (a pull before it was refused, and the whole
        # group fell back a step).
        _all_succeeded(True, device)  # nobody failed anything yet: a barrier on the training group
        spans.mark("keyed")
    tried_template = False
    for step in sorted(common, reverse=True):
        if step < durable:
            break
        if step < local_bound and step < verified_local().newest:  # a newer local checkpoint wins
            break
        tried_template = True
        found = _snapshot_source(step, offers, store, peers)
        spans.mark("fetch")
        if isinstance(found, str):
            error: str | None = found
        else:
            source, source_store, offer = found
            error = _load_snapshot(source_store, offer, state, rank)
        ok = _all_succeeded(error is None, device)
        spans.mark("confirm")
        if ok:
            assert store is not None and not isinstance(found, str)
            store.discard_newer_than(step)
            path, load_s = str(source_store.path(offer.slot)), time.perf_counter() - t0
            if peers is not None:
                peers.after_restore(step)
            spans.mark("cleanup")
            events.emit("restore", step=step, path=path, load_s=load_s, source=source)
            return Restored(step, source, path, load_s, [], refused)
        log.warning("snapshot of step %d not restored on every rank (here: %s); agreeing again", step, error)
        refused.append(f"step {step}: {error or 'failed on another rank'}")
    from_local = local_restore.restore_local(ckpt, state, verified_local(), events=events, t0=t0)
    if from_local is not None:
        if store is not None:
            store.discard_newer_than(from_local[0])
        if peers is not None:
            peers.after_restore(from_local[0])
        return Restored(from_local[0], "local", from_local[1], from_local[2], [], refused)
    result = ckpt.restore(state)
    if result < 0 and tried_template:
        # A failed snapshot load may have overwritten part of the live state, and there is no durable
        # checkpoint to overwrite it again: start over in fresh objects, without those snapshots.
        assert store is not None
        store.discard_newer_than(min(common) - 1)
        if peers is not None:
            peers.after_restore(min(common) - 1)
        raise RuntimeError("a snapshot restore failed part-way and no checkpoint exists: restarting")
    if peers is not None:
        peers.after_restore(result)
    if result < 0:
        _reset_optimizer(state)
    if store is not None:
        store.discard_newer_than(result)
    source = "fsx" if result >= 0 else "none"
    return Restored(result, source, "", time.perf_counter() - t0, [], refused)


def _snapshot_source(
    step: int, offers: list[Offer], store: SnapshotStore | None, peers: PeerReplicas | None
) -> tuple[str, SnapshotStore, Offer] | str:
    """Where this rank gets its snapshot of `step` (SNAPSHOT_SOURCES, in order), or why it cannot."""
    own = next((o for o in offers if o.header.step == step), None)
    if own is not None and store is not None:
        return ("memory" if own.written_here else "shm"), store, own
    if peers is None:
        return f"no snapshot of step {step} here"
    pulled = peers.fetch(step)
    return pulled if isinstance(pulled, str) else ("peer", *pulled)


def _load_snapshot(store: SnapshotStore | None, offer: Offer, state: dict[str, Any], rank: int) -> str | None:
    try:
        assert store is not None
        template = build_save_dict(state, rank)
        spans.mark("template")
        skeleton, tensors = codec.flatten(template)
        expected = codec.layout_id(skeleton, codec.plan(tensors)[0])
        spans.mark("layout")
        loaded = store.load(offer, template, expected)
        spans.mark("fill")
        apply_filled(state, loaded, rank)
        spans.mark("apply")
        return None
    except Exception as exc:
        return f"{type(exc).__name__}: {str(exc)[:300]}"


def _all_succeeded(ok: bool, device: torch.device) -> bool:
    flag = torch.tensor([0 if ok else 1], dtype=torch.int64, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return int(flag.item()) == 0


def _newest_durable_step(ckpt: Any) -> int:
    """Newest committed durable step (unverified: load_latest verifies and may fall back further)."""
    candidates, _ = layout.scan(ckpt.cfg.dir)
    return max((c.step for c in candidates if c.problem is None), default=-1)


def _reset_optimizer(state: dict[str, Any]) -> None:
    """Building a state-dict template (for a checkpoint that then failed to load) runs the optimizer
    once with lr 0 to create its state; a fresh start must not keep it (AdamW's step counter would be
    one ahead of a run that never looked)."""
    optim = state.get("optim")
    if optim is not None:
        optim.state.clear()
