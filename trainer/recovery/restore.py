"""Where a (re)started rank gets its state: agreed by every rank before any rank loads.

Sources, in the order tried (SOURCES below; Contract 3 lists them as the `restore` event's `source`):
`memory` (this process's own snapshot: tier 1, in-process restart), `shm` (a snapshot left in the pod's
/dev/shm by an earlier worker process: tier 2, worker restart), `peer` (this rank's replica kept by a
rank on another node: a replaced or spare node, whose /dev/shm is empty), `local` (the durable
checkpoint's copy on the node's NVMe, trainer/recovery/local_restore.py), the durable checkpoint
(`fsx`), or nothing (`none`, a fresh start). A newer step wins; of one step, the earlier source.

The agreement is one small all_gather on the training group: each rank offers the steps of its verified
snapshots (checksum, run, world size, rank), the replicas it keeps for other ranks (trainer/snapshot/
replica.py) and its newest locally sealed step (unverified: a directory listing), and rank 0 adds the
newest committed durable step. Every rank then restores the newest step that every rank can restore from
memory (its own snapshot, else its peer's replica), if it is at least as new as the durable checkpoint
and as the local one; after loading, one more all_reduce confirms that every rank succeeded. The local
tier is verified (each rank checksums its files, and a second all_gather agrees on the steps,
trainer/recovery/local_restore.py) only when a local step could win: when the snapshot step is older
than the oldest of the ranks' newest sealed steps, or no snapshot loads.
If any rank failed (a replica that fails its checksum once pulled, a peer gone meanwhile), that step is
struck off and the group agrees again, down to the durable checkpoint: a rank never resumes at a step
its peers do not.

Every copy is checked against the digest taken when it was made before a byte of it is restored
(docs/failure-domains.md lists each source's check). The newest own snapshot, the one a restore almost
always loads, is checked before the agreement, its own process's memory (tier 1) included: a damaged one
is not offered, so the same step comes from the next source (the peer's replica) if a peer holds it.
A copy that fails is reported (`restore_skipped`, Contract 3) and quarantined where it lies, so no
later restore meets it again; nothing is retried.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from trainer.checkpoint import layout
from trainer.events import spans
from trainer.recovery import local_restore
from trainer.recovery.local_restore import NONE
from trainer.snapshot.store import CorruptCopy, Offer, Rejected, SnapshotStore
from trainer.state import codec
from trainer.state.save_dict import apply_filled, build_save_dict

if TYPE_CHECKING:
    from trainer.snapshot.manager import Snapshots
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


def restore_attempt(
    snapshots: Snapshots, ckpt: Any, state: dict[str, Any], device: torch.device, events: Any
) -> Restored:
    """Before an attempt's first step: ready the snapshots (their budget, the replicas quiet), then
    `restore` from the newest source every rank has. A collective: all ranks call it."""
    snapshots.before_restore(state, events)
    return restore(
        snapshots.store, ckpt, state, rank=snapshots.rank, device=device, events=events, peers=snapshots.peers
    )


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
    # One slot of the two is loaded: the newest is checked now, the other by a load that reads it.
    offers, rejected = store.offers(verify_payload=False) if store is not None else ([], [])
    offers, rejected = _verify_newest(store, offers, rejected)
    refused = [f"slot {r.slot}: {r.reason}" for r in rejected]
    for r in rejected:
        log.warning("snapshot not offered: slot %d: %s", r.slot, r.reason)
        if r.corrupt:
            skipped(events, "memory" if r.written_here else "shm", r.step, r.reason)
    spans.mark("offers")
    table = _Table.agree(offers, ckpt, rank, device, peers)
    local = _LocalSource(ckpt, state, table, device, refused, events)
    tiers = _Tiers(store, peers)
    snapshot, tried = _restore_snapshot(table, offers, tiers, state, rank, device, local, refused, t0, events)
    if snapshot is not None:
        step, source, path, load_s = snapshot
        events.emit("restore", step=step, path=path, load_s=load_s, source=source)
        return Restored(step, source, path, load_s, [], refused)
    from_local = local_restore.restore_local(ckpt, state, local.candidates(), events=events, t0=t0)
    if from_local is not None:
        tiers.keep_up_to(from_local[0])
        return Restored(from_local[0], "local", from_local[1], from_local[2], [], refused)
    return _restore_durable(ckpt, state, table, tiers, tried, t0, refused)


def skipped(events: Any, source: str, step: int, reason: str) -> None:
    """A copy that failed its check (or its load) and was passed over for the next source."""
    log.warning("restore: %s copy of step %d skipped: %s", source, step, reason)
    events.emit("restore_skipped", source=source, step=step, reason=reason[:300])


def _verify_newest(
    store: SnapshotStore | None, offers: list[Offer], rejected: list[Rejected]
) -> tuple[list[Offer], list[Rejected]]:
    """The offers with the newest one's payload checked (or dropped into `rejected`, quarantined)."""
    if store is None or not offers:
        return offers, rejected
    newest, rest = offers[0], offers[1:]
    try:
        store.verify(newest)
    except CorruptCopy as exc:
        bad = Rejected(newest.slot, str(exc), True, newest.header.step, newest.written_here)
        return rest, [*rejected, bad]
    return [dataclasses.replace(newest, payload_verified=True), *rest], rejected


@dataclass(frozen=True)
class _Table:
    """What one all_gather on the training group told every rank alike (each rank offers its snapshot
    steps, its newest locally sealed step and the replicas it keeps; rank 0 the newest durable step)."""

    durable: int
    """The newest committed durable step (rank 0's scan; -1: none)."""
    local_bound: int
    """No local step that every rank has is newer (the minimum of the ranks' newest sealed steps)."""
    has: list[set[int]]
    """Per rank, the snapshot steps it can restore: its own, and those a peer keeps a replica of."""
    own: list[set[int]]
    """Per rank, the snapshot steps of its own slots."""

    @property
    def common(self) -> set[int]:
        """The snapshot steps every rank can restore."""
        return set.intersection(*self.has)

    @classmethod
    def agree(
        cls, offers: list[Offer], ckpt: Any, rank: int, device: torch.device, peers: PeerReplicas | None
    ) -> _Table:
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
        has = [{s for s in r[:OFFERED] if s >= 0} for r in table]
        own = [set(steps) for steps in has]
        if peers is not None:  # a step a peer keeps a replica of counts as one the rank has
            for owner, steps in enumerate(peers.learn([r[OFFERED + 2 :] for r in table])):
                has[owner] |= steps
        spans.mark("learn")
        local_bound = min(int(r[OFFERED + 1]) for r in table)
        return cls(int(table[0][OFFERED]), local_bound, has, own)


class _LocalSource:
    """The local tier's candidates, verified (each rank's files read and checksummed, one more
    all_gather) only once a local step could win: every rank decides alike, from the table."""

    def __init__(
        self,
        ckpt: Any,
        state: dict[str, Any],
        table: _Table,
        device: torch.device,
        refused: list[str],
        events: Any,
    ) -> None:
        self._ckpt, self._state, self._table, self._device = ckpt, state, table, device
        self._refused, self._events = refused, events
        self._candidates: local_restore.LocalCandidates | None = None

    def candidates(self) -> local_restore.LocalCandidates:
        if self._candidates is None:
            durable = self._table.durable
            could = self._table.local_bound >= max(durable, 0)
            found = local_restore.agree(self._ckpt, self._state, durable, self._device) if could else NONE
            self._refused.extend(found.refused)
            for step, reason in found.damaged:
                skipped(self._events, "local", step, reason)
            self._candidates = found
            spans.mark("local_agree")
        return self._candidates

    def newer_than(self, step: int) -> bool:
        """A local step newer than `step` every rank can restore (verifies only when one could be)."""
        return step < self._table.local_bound and step < self.candidates().newest


@dataclass(frozen=True)
class _Tiers:
    """The snapshot tiers of this rank: after a restore of any source, nothing newer is kept or served."""

    store: SnapshotStore | None
    peers: PeerReplicas | None

    def keep_up_to(self, step: int) -> None:
        if self.store is not None:
            self.store.discard_newer_than(step)
        if self.peers is not None:
            self.peers.after_restore(step)


def _restore_snapshot(
    table: _Table,
    offers: list[Offer],
    tiers: _Tiers,
    state: dict[str, Any],
    rank: int,
    device: torch.device,
    local: _LocalSource,
    refused: list[str],
    t0: float,
    events: Any,
) -> tuple[tuple[int, str, str, float] | None, bool]:
    """The newest snapshot step every rank restored, with this rank's source, slot path and the seconds
    since `t0` it took (None when none is at least as new as the durable and the local checkpoint, or
    none loaded on every rank), and whether any was tried (its load may have overwritten part of the
    live state). A step that failed on any rank is struck off and the group agrees on the next one."""
    common = table.common
    if tiers.peers is not None and any(common - steps for steps in table.own):
        # A rank will pull from a peer, and a holder serves only once `learn` gave it the channel key:
        # one empty all_reduce lets every rank learn first (a pull before it was refused, and the whole
        # group fell back a step).
        _all_succeeded(True, device)  # nobody failed anything yet: a barrier on the training group
        spans.mark("keyed")
    tried = False
    for step in sorted(common, reverse=True):
        if step < table.durable or local.newer_than(step):
            break
        tried = True
        found = _snapshot_source(step, offers, tiers.store, tiers.peers)
        spans.mark("fetch")
        if isinstance(found, str):
            error: str | None = found
            if tiers.peers is not None and tiers.peers.holds(step):  # a pulled copy failed, or its holder
                skipped(events, "peer", step, found)
        else:
            source, source_store, offer = found
            error = _load_snapshot(source_store, offer, state, rank)
            if error is not None:
                skipped(events, source, step, error)
        ok = _all_succeeded(error is None, device)
        spans.mark("confirm")
        if ok:
            assert not isinstance(found, str)
            path, load_s = str(source_store.path(offer.slot)), time.perf_counter() - t0
            tiers.keep_up_to(step)
            spans.mark("cleanup")
            return (step, source, path, load_s), tried
        log.warning("snapshot of step %d not restored on every rank (here: %s); agreeing again", step, error)
        refused.append(f"step {step}: {error or 'failed on another rank'}")
    return None, tried


def _restore_durable(
    ckpt: Any, state: dict[str, Any], table: _Table, tiers: _Tiers, tried: bool, t0: float, refused: list[str]
) -> Restored:
    """The durable checkpoint (the CheckpointLoop's own restore and its `restore` event), else a fresh
    start."""
    result = ckpt.restore(state)
    if result < 0 and tried:
        # A failed snapshot load may have overwritten part of the live state, and there is no durable
        # checkpoint to overwrite it again: start over in fresh objects, without those snapshots.
        assert tiers.store is not None
        tiers.keep_up_to(min(table.common) - 1)
        raise RuntimeError("a snapshot restore failed part-way and no checkpoint exists: restarting")
    if result < 0:
        _reset_optimizer(state)
    tiers.keep_up_to(result)
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
