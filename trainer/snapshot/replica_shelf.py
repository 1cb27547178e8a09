"""The replicas a rank keeps for ranks on another node, in its pod's /dev/shm: `<dir>/replicas/`.

A replica is a byte-for-byte copy of the owner's slot file (trainer/snapshot/store.py's format: 4 KiB
header, payload), kept as `rank<P>.slot<0|1>` under the owner's rank P, so that a SnapshotStore opened
with rank=P verifies and loads it exactly like the owner's own snapshot (checksum, run, world size, rank,
layout). Receiving is double buffered like the owner's writes: the bytes go to the slot not holding the
owner's newest verified replica, the magic stays zero until the received payload's CRC32 matches the
header's, and the header is written last, so a sender that dies mid-transfer leaves the previous replica
whole. The same class holds a pulled replica on the restoring side (`<dir>/pulled/`).
"""

from __future__ import annotations

import logging
import mmap
import os
import threading
import traceback
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from trainer.snapshot.store import HEADER_BYTES, MAGIC, SnapshotStore, parse_header

log = logging.getLogger(__name__)

Reader = Callable[[memoryview], None]
"""Fills the whole buffer it is given (from a socket) or raises."""


@dataclass(frozen=True)
class Held:
    """A verified replica: whose, of which step, in which slot file."""

    owner: int
    step: int
    slot: int
    path: Path
    nbytes: int


class ReplicaShelf:
    """Double-buffered replica slots of other ranks in one directory; thread-safe (server and loop)."""

    def __init__(
        self,
        directory: Path,
        *,
        world_size: int,
        fingerprint: str,
        manages: Callable[[int], bool] | None = None,
    ) -> None:
        """`manages(owner)`: whether `held()` and `discard()` look at owner's files at all. The directory
        is the pod's, shared by all its ranks: without it, one rank's discard deleted the replica a
        local peer was serving (seen in the demo: FileNotFoundError in the peer's restore). None: every
        file (a directory of this rank's alone)."""
        self.dir = Path(directory)
        self.world_size, self.fingerprint = world_size, fingerprint
        self.manages = manages
        self.dir.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._newest: dict[int, tuple[int, int]] = {}  # owner -> (slot, step) of its newest verified replica

    def path(self, owner: int, slot: int) -> Path:
        return self.dir / f"rank{owner}.slot{slot}"

    def receive(self, owner: int, step: int, nbytes: int, read: Reader) -> int:
        """Store owner's snapshot of `step` (`nbytes`, header included, filled by `read`); the slot used.

        Raises ValueError when the received bytes are not that snapshot whole (the slot stays invalid).
        """
        if nbytes <= HEADER_BYTES:
            raise ValueError(f"replica of {nbytes} bytes is shorter than its header")
        with self._lock:
            newest = self._newest_of(owner)
            slot = 1 - newest[0] if newest is not None else 0
            header = bytearray(HEADER_BYTES)
            fd = os.open(self.path(owner, slot), os.O_RDWR | os.O_CREAT, 0o600)
            try:
                os.ftruncate(fd, nbytes)
                mm = mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            finally:
                os.close(fd)
            try:
                mm[0 : len(MAGIC)] = b"\0" * len(MAGIC)  # invalid until verified
                problem = _fill_and_check(mm, header, owner, step, nbytes, read, self)
                if problem is None:
                    mm[len(MAGIC) : HEADER_BYTES] = header[len(MAGIC) :]
                    mm[0 : len(MAGIC)] = MAGIC  # the moment the replica becomes valid
            finally:
                mm.close()
            if problem is not None:
                raise ValueError(f"replica of rank {owner} step {step} refused: {problem}")
            self._newest[owner] = (slot, step)
            return slot

    def held(self) -> list[Held]:
        """Every replica here that verifies (checksum, run, world size, rank), newest first."""
        with self._lock:
            found: list[Held] = []
            for owner in self._owners():
                found += self._verified(owner)
            return sorted(found, key=lambda h: (h.step, -h.owner), reverse=True)

    def find(self, owner: int, step: int) -> Held | None:
        """The verified replica of owner's `step`, if held."""
        with self._lock:
            return next((h for h in self._verified(owner) if h.step == step), None)

    def reader(self, owner: int) -> SnapshotStore:
        """A store over owner's replica slots, to load one (close it when done)."""
        return SnapshotStore(self.dir, rank=owner, world_size=self.world_size, fingerprint=self.fingerprint)

    def discard(self, keep: Callable[[Held], bool]) -> None:
        """Delete every replica for which keep(held) is false, and every file that does not verify."""
        with self._lock:
            for owner in self._owners():
                good = {h.slot: h for h in self._verified(owner)}
                for slot in (0, 1):
                    h = good.get(slot)
                    if h is None or not keep(h):
                        self.path(owner, slot).unlink(missing_ok=True)
                self._newest.pop(owner, None)

    def remove(self) -> None:
        self.discard(lambda _: False)

    # ------------------------------------------------------------------------------------- internals
    def _owners(self) -> list[int]:
        owners = set()
        for p in self.dir.glob("rank*.slot*"):
            head = p.name.removeprefix("rank").split(".slot")[0]
            if head.isdigit() and (self.manages is None or self.manages(int(head))):
                owners.add(int(head))
        return sorted(owners)

    def _verified(self, owner: int) -> list[Held]:
        store = self.reader(owner)
        try:
            offers, _ = store.offers()
            return [
                Held(owner, o.header.step, o.slot, store.path(o.slot), HEADER_BYTES + o.header.payload_bytes)
                for o in offers
            ]
        finally:
            store.close()

    def _newest_of(self, owner: int) -> tuple[int, int] | None:
        if owner not in self._newest:
            held = self._verified(owner)
            if held:
                self._newest[owner] = (held[0].slot, held[0].step)
        return self._newest.get(owner)


def _fill_and_check(
    mm: mmap.mmap, header: bytearray, owner: int, step: int, nbytes: int, read: Reader, shelf: ReplicaShelf
) -> str | None:
    """Read the replica into `header` and the mapping; None if it is owner's `step` whole, else why not.

    Errors come back as text, their tracebacks cleared: a frame still holding a view of the mapping
    would keep it from being closed.
    """
    try:
        read(memoryview(header))
        with memoryview(mm) as view:
            payload = view[HEADER_BYTES:nbytes]
            read(payload)
            h, why = parse_header(header)
            if h is None:
                return f"header: {why}"
            return (
                (h.rank != owner and f"header of rank {h.rank}")
                or (h.step != step and f"header of step {h.step}")
                or (h.fingerprint != shelf.fingerprint and "another run")
                or (h.world_size != shelf.world_size and f"world size {h.world_size}")
                or (HEADER_BYTES + h.payload_bytes != nbytes and "length differs from its header")
                or (zlib.crc32(payload) != h.crc32 and "payload checksum mismatch")
                or None
            )
    except Exception as exc:  # the connection broke or timed out mid-transfer
        traceback.clear_frames(exc.__traceback__)
        return f"{type(exc).__name__}: {exc}"
