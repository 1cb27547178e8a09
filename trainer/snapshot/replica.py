"""Peer replicas: every committed snapshot is also sent to a rank on the next node (trainer/snapshot/ring.py).

One `PeerReplicas` per process (it outlives in-process restarts, like the SnapshotStore it follows):
- a ReplicaServer that keeps the previous node's replicas in this pod's /dev/shm and serves them back;
- a sender thread: once the store committed a slot (its checksum thread calls `_committed`), the slot
  file goes to the holder. Only the newest snapshot is sent: one that is still queued when a newer one
  commits is skipped. The loop never waits for the network, except when it is about to overwrite the
  very slot being sent (a send slower than two snapshot intervals): `before_write` waits for it, and
  that wait is counted in the snapshot's blocked time;
- the restore side: `offer_row` / `learn` join the restore agreement (trainer/recovery/restore.py),
  `fetch` pulls this rank's replica from whoever holds it (a replaced node's /dev/shm is empty).

Holder addresses travel in the restore agreement's all_gather (IPv4 address and port as integers), so
the channel needs no store of its own and follows the ranks of each restart. So does the channel key:
rank 0 adds a random 256-bit value (drawn once per process) to its row, and every rank keys the channel
with HMAC(job key, that value), the job key being the chart's per-release Secret
(TRAINER_REPLICA_KEY_FILE, docs/design.md Contract 5) or, in a plain local run without one, a constant:
then the channel is as private as the training group's own traffic, which the ranks already trust.
A holder takes a PUT only from the rank whose replica it keeps and serves a rank only its own replica.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import ipaddress
import logging
import secrets
import threading
import time
from typing import Any

from trainer.security.keys import key_id, replica_file_key
from trainer.snapshot import replica_net
from trainer.snapshot.replica_shelf import ReplicaShelf
from trainer.snapshot.ring import Ring
from trainer.snapshot.store import Offer, SnapshotStore

log = logging.getLogger(__name__)

HELD_OFFERED = 4
"""(owner, step) pairs each rank offers: two slots of its ring owner, and room for one earlier owner."""
REPLICAS, PULLED = "replicas", "pulled"
"""Subdirectories of the snapshot directory: replicas kept for other ranks; a replica pulled back."""
SEED_WORDS = 4
"""int64 words of rank 0's channel seed in the agreement (256 bits; zero in other ranks' rows)."""
ROW = 2 + SEED_WORDS + 2 * HELD_OFFERED
"""Integers each rank adds to the restore agreement: IPv4 address, port, seed, then the held pairs."""
_NO_FILE_KEY = b"trainer replica channel: no job key file"


class PeerReplicas:
    def __init__(self, store: SnapshotStore, ring: Ring, *, host: str) -> None:
        self.store, self.ring, self.rank = store, ring, store.rank
        self.holder = ring.holder(self.rank)
        size, fingerprint = store.world_size, store.fingerprint
        self.owner = ring.owner(self.rank)
        # The pod's ranks share both directories: each looks after the replicas it keeps, and local
        # rank 0 also after those no rank of this node keeps any more (the ring moved); a pulled copy is
        # its puller's alone.
        node_ranks = ring.node_ranks(self.rank)
        kept_here = {ring.owner(r) for r in node_ranks}
        first_local = self.rank == node_ranks[0]
        self.shelf = ReplicaShelf(
            store.dir / REPLICAS,
            world_size=size,
            fingerprint=fingerprint,
            manages=lambda owner: owner == self.owner or (first_local and owner not in kept_here),
        )
        self.pulled = ReplicaShelf(
            store.dir / PULLED,
            world_size=size,
            fingerprint=fingerprint,
            manages=lambda owner: owner == self.rank,
        )
        self._file_key = replica_file_key()
        self._seed = secrets.token_bytes(8 * SEED_WORDS)
        self._key: bytes | None = None
        self.server = replica_net.ReplicaServer(
            self.shelf,
            host,
            may_put=lambda requester, owner: requester == owner == self.owner,
            may_get=lambda requester, owner: requester == owner,
        )
        self.events: Any = None
        """The EventLog for `replica` events (set by the manager at each restore)."""
        self._cond = threading.Condition()
        self._holder_address: replica_net.Address | None = None
        self._newest: tuple[int, int] | None = None  # (slot, step) last committed
        self._queued: tuple[int, int] | None = None
        self._inflight: tuple[int, int] | None = None
        self._closed = False
        self._failures = 0
        self._addresses: dict[int, replica_net.Address] = {}
        self._holders: dict[int, list[int]] = {}  # step of this rank -> ranks holding its replica
        self._reader: SnapshotStore | None = None
        self._thread = threading.Thread(target=self._send_loop, name="replica-sender", daemon=True)
        self._thread.start()
        store.on_commit = self._committed
        log.info("peer replicas: rank %d keeps rank %s's, sends its own to rank %s (at %s:%d)",
                 self.rank, ring.owner(self.rank), self.holder, *self.server.address)  # fmt: skip

    # ------------------------------------------------------------------------------ training side
    def _committed(self, slot: int, step: int) -> None:
        with self._cond:
            self._newest = self._queued = (slot, step)
            self._cond.notify_all()

    def before_write(self) -> float:
        """Wait while the slot the next snapshot overwrites is being sent; the seconds waited."""
        t0 = time.perf_counter()
        with self._cond:
            while self._overwrites_inflight():
                self._cond.wait()
        return time.perf_counter() - t0

    def _overwrites_inflight(self) -> bool:
        # the store writes the slot not holding the newest snapshot: the one in flight if it is older
        busy, newest = self._inflight, self._newest
        return busy is not None and newest is not None and busy[0] != newest[0]

    def quiesce(self) -> None:
        """Drop what is queued and wait for the send in flight (before a restore agreement)."""
        with self._cond:
            self._queued = None
            while self._inflight is not None:
                self._cond.wait()

    def flush(self, timeout_s: float) -> bool:
        """Wait until the newest committed snapshot has been sent (or failed); False if still busy."""
        self.store.wait()  # its commit queues it
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._queued is not None or self._inflight is not None:
                left = deadline - time.monotonic()
                if left <= 0 or (self._queued is not None and self._holder_address is None):
                    return False
                self._cond.wait(left)
        return True

    def _send_loop(self) -> None:
        while True:
            with self._cond:
                while not self._closed and (self._queued is None or self._holder_address is None):
                    self._cond.wait()
                if self._closed:
                    return
                assert self._queued is not None and self._holder_address is not None
                self._inflight, self._queued = self._queued, None
                slot, step = self._inflight
                address = self._holder_address
            try:
                self._send(slot, step, address)
            finally:
                with self._cond:
                    self._inflight = None
                    self._cond.notify_all()

    def _send(self, slot: int, step: int, address: replica_net.Address) -> None:
        t0 = time.perf_counter()
        path = self.store.path(slot)
        try:
            nbytes = path.stat().st_size
            assert self._key is not None  # set by learn() before any address is
            replica_net.put(address, self.rank, step, path, nbytes, key=self._key)
        except (OSError, replica_net.ReplicaError) as exc:
            self._failures += 1
            if self._failures in (1, 10, 100) or self._failures % 1000 == 0:
                log.warning("replica of step %d to rank %s failed (%d so far): %s", step, self.holder,
                            self._failures, exc)  # fmt: skip
            self._emit(step=step, holder=self.holder, bytes=0, send_s=time.perf_counter() - t0, ok=False,
                       error=str(exc)[:200])  # fmt: skip
            return
        self._emit(step=step, holder=self.holder, bytes=nbytes, send_s=time.perf_counter() - t0, ok=True)

    def _emit(self, **fields: Any) -> None:
        try:
            if self.events is not None:
                self.events.emit("replica", **fields)
        except Exception as exc:  # a closed log at the end of a run must not kill the sender
            log.debug("replica event not written: %s", exc)

    # ------------------------------------------------------------------------------- restore side
    def offer_row(self) -> list[int]:
        """This rank's part of the restore agreement: its address, then the replicas it holds."""
        host, port = self.server.address
        row = [int(ipaddress.IPv4Address(host)), port]
        seed = self._seed if self.rank == 0 else bytes(8 * SEED_WORDS)
        row += [int.from_bytes(seed[8 * i : 8 * i + 8], "little", signed=True) for i in range(SEED_WORDS)]
        for held in self.shelf.held()[:HELD_OFFERED]:
            row += [held.owner, held.step]
        self._report_damaged()
        return row + [-1] * (ROW - len(row))

    def _report_damaged(self) -> None:
        """A replica held here that no longer matches its digest: quarantined by the shelf, not offered,
        reported once (`restore_skipped`, source `peer`, with the rank it was kept for)."""
        for owner, step, reason in self.shelf.take_damaged():
            log.warning("replica of rank %d step %d kept here is damaged: %s", owner, step, reason)
            try:
                if self.events is not None:
                    self.events.emit("restore_skipped", source="peer", step=step, reason=reason, owner=owner)
            except Exception as exc:
                log.debug("restore_skipped event not written: %s", exc)

    def holds(self, step: int) -> bool:
        """Whether some peer offered a replica of this rank's `step` in the last agreement."""
        return bool(self._holders.get(step))

    def damage_held(self, owner: int) -> int:
        """Fault injection (`replica-corrupt`): damage the replicas kept here for `owner`, now and as they
        arrive; the number damaged now (0 when this rank keeps none of owner's)."""
        return self.shelf.damage_all(owner) if owner == self.owner else 0

    def learn(self, rows: list[list[int]]) -> list[set[int]]:
        """Read every rank's row; for each rank, the steps some peer holds a replica of."""
        self._addresses = {r: (str(ipaddress.IPv4Address(row[0])), int(row[1])) for r, row in enumerate(rows)}
        seed = b"".join(int(w).to_bytes(8, "little", signed=True) for w in rows[0][2 : 2 + SEED_WORDS])
        key = hmac.new(self._file_key or _NO_FILE_KEY, b"replica channel\0" + seed, hashlib.sha256).digest()
        if key != self._key:
            log.info("replica channel keyed (%s job key, key id %s)",
                     "with the" if self._file_key else "without a", key_id(key))  # fmt: skip
        self._key = self.server.key = key
        self._holders = {}
        steps: list[set[int]] = [set() for _ in rows]
        for holder, row in enumerate(rows):
            pairs = row[2 + SEED_WORDS : ROW]
            for owner, step in zip(pairs[0::2], pairs[1::2], strict=True):
                if 0 <= owner < len(rows) and step >= 0:  # owner == holder: the ranks moved nodes
                    steps[owner].add(step)
                    if owner == self.rank:
                        self._holders.setdefault(step, []).append(holder)
        with self._cond:
            self._holder_address = self._addresses.get(self.holder) if self.holder is not None else None
            self._cond.notify_all()
        return steps

    def fetch(self, step: int) -> tuple[SnapshotStore, Offer] | str:
        """Pull this rank's replica of `step` from a peer holding it: (a store to load it from, the
        offer), or why not (every holder tried)."""
        errors = []
        for holder in self._holders.get(step, []):
            try:
                assert self._key is not None
                replica_net.get(self._addresses[holder], self.rank, step, self.pulled, key=self._key)
            except (OSError, ValueError, replica_net.ReplicaError) as exc:
                errors.append(f"rank {holder}: {exc}")
                continue
            self._reader = self._reader or self.pulled.reader(self.rank)
            # checked on receipt (replica_shelf), and once more by the load that reads it
            offers, rejected = self._reader.offers(verify_payload=False)
            offer = next((o for o in offers if o.header.step == step), None)
            if offer is not None:
                return self._reader, offer
            errors.append(f"rank {holder}: pulled replica does not verify ({rejected})")
        return "; ".join(errors) or f"no peer holds a replica of step {step}"

    def set_limit(self, nbytes: int) -> None:
        """The largest replica this rank takes (its pod's slot budget per copy)."""
        self.shelf.limit = self.pulled.limit = nbytes

    def after_restore(self, step: int) -> None:
        """Every rank restored `step`: replicas of a later step are another past, a pulled copy is no
        longer needed, and replicas of a rank this one no longer keeps (the ring moved) free their memory."""
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        self.pulled.remove()
        self.shelf.discard(lambda h: h.step <= step and h.owner == self.owner)

    def close(self, *, remove: bool = False) -> None:
        if self.store.on_commit == self._committed:
            self.store.on_commit = None
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=replica_net.IO_TIMEOUT_S)
        self.server.close()
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        if remove:
            for shelf in (self.shelf, self.pulled):
                shelf.remove()
                with contextlib.suppress(OSError):
                    shelf.dir.rmdir()
