"""The replicas a rank keeps for ranks on another node, in its pod's /dev/shm: `<dir>/replicas/`.

A replica is a byte-for-byte copy of the owner's slot file (trainer/snapshot/store.py's format: 4 KiB
header, payload), kept as `rank<P>.slot<0|1>` under the owner's rank P, so that a SnapshotStore opened
with rank=P verifies and loads it exactly like the owner's own snapshot (checksum, run, world size, rank,
layout). Receiving is double buffered like the owner's writes: the bytes go to the slot not holding the
owner's newest verified replica, the magic stays zero until the received payload's checksum matches the
header's, and the header is written last, so a sender that dies mid-transfer leaves the previous replica
whole. The same class holds a pulled replica on the restoring side (`<dir>/pulled/`).
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from trainer.snapshot.checksum import payload_checksum
from trainer.snapshot.store import HEADER_BYTES, SnapshotStore, parse_header

log = logging.getLogger(__name__)

Reader = Callable[[memoryview], None]
"""Fills the whole buffer it is given (from a socket) or raises."""
SUPERSEDE_WAIT_S = 10.0
"""How long a transfer waits for an earlier one of the same owner to be cut off and cleaned up."""
Finish = Callable[[], "str | None"]
"""Called once every byte is read: None, or why the transfer is not authentic (the sender's MAC)."""


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
        local peer was serving (a FileNotFoundError in the peer's restore). None: every
        file (a directory of this rank's alone)."""
        self.dir = Path(directory)
        self.world_size, self.fingerprint = world_size, fingerprint
        self.manages = manages
        self.dir.mkdir(parents=True, exist_ok=True)
        self.limit: int | None = None
        """Largest replica accepted (bytes, header included): the pod's slot budget, set by the snapshot
        manager once it knows a snapshot's size. None: only the free space bounds it."""
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._incoming: set[int] = set()
        for stale in self.dir.glob(".incoming-rank*"):  # of a process that died receiving: tmpfs pages
            if not _alive(stale.name.split("-")[2]):
                stale.unlink(missing_ok=True)
        self._newest: dict[int, tuple[int, int]] = {}  # owner -> (slot, step) of its newest verified replica
        self.damaged: list[tuple[int, int, str]] = []
        """(owner, step, why) of each replica found damaged at rest and quarantined (`held`, `find`):
        PeerReplicas reports them and clears the list."""
        self.damage_owners: set[int] = set()
        """Fault injection only (`replica-corrupt`): owners whose replicas this shelf damages once stored."""

    def path(self, owner: int, slot: int) -> Path:
        return self.dir / f"rank{owner}.slot{slot}"

    def admissible(self, owner: int, nbytes: int) -> str | None:
        """None if a replica of `owner` of `nbytes` may be received now, else why not. Checked before
        anything is allocated: the owner is a rank of this job, the size is within `limit` (the pod's
        slot budget, trainer/snapshot/budget.py) and within what the directory's file system has free."""
        if not 0 <= owner < self.world_size:
            return f"owner rank {owner} outside 0..{self.world_size - 1}"
        if nbytes <= HEADER_BYTES:
            return f"replica of {nbytes} bytes is shorter than its header"
        if self.limit is not None and nbytes > self.limit:
            return f"replica of {nbytes} bytes is larger than this pod's slot budget of {self.limit} bytes"
        st = os.statvfs(self.dir)
        with self._lock:
            reclaim = sum(p.stat().st_size for p in self._replaced(owner) if p.exists())
        if nbytes > st.f_bavail * st.f_frsize + reclaim:
            return f"replica of {nbytes} bytes does not fit in {self.dir} ({st.f_bavail * st.f_frsize} free)"
        return None

    def receive(
        self, owner: int, step: int, nbytes: int, read: Reader, *, finish: Finish | None = None
    ) -> int:
        """Store owner's snapshot of `step` (`nbytes`, header included, filled by `read`); the slot used.

        The bytes go to a temp file received outside the lock (a slow sender holds up nobody), whose
        pages are reserved up front (no SIGBUS on a full tmpfs); `finish()` (the sender's MAC) and the
        header and checksum are checked, and only then is it renamed over the slot not holding the
        owner's newest replica. A failed transfer leaves no file behind. Raises ValueError when the
        bytes are not that snapshot whole, or the replica is not admissible.
        """
        problem = self.admissible(owner, nbytes)
        if problem is not None:
            raise ValueError(f"replica of rank {owner} step {step} refused: {problem}")
        with self._lock:
            # one transfer per owner: a newer one waits for an older one to end (the server cuts a
            # superseded connection off: ReplicaServer)
            if not self._idle.wait_for(lambda: owner not in self._incoming, timeout=SUPERSEDE_WAIT_S):
                raise ValueError(
                    f"replica of rank {owner} step {step} refused: another transfer is under way"
                )
            self._incoming.add(owner)
            for old in self._replaced(owner):  # free the older replica's pages before taking new ones
                old.unlink(missing_ok=True)
        tmp = self.dir / f".incoming-rank{owner}-{os.getpid()}-{threading.get_ident()}"
        try:
            problem = self._fill(tmp, owner, step, nbytes, read, finish)
            if problem is not None:
                raise ValueError(f"replica of rank {owner} step {step} refused: {problem}")
            with self._lock:
                newest = self._newest_of(owner)
                slot = 1 - newest[0] if newest is not None else 0
                os.replace(tmp, self.path(owner, slot))  # the moment the replica becomes valid
                self._newest[owner] = (slot, step)
                if owner in self.damage_owners:
                    damage(self.path(owner, slot))
                return slot
        finally:
            tmp.unlink(missing_ok=True)
            with self._lock:
                self._incoming.discard(owner)
                self._idle.notify_all()

    def _replaced(self, owner: int) -> list[Path]:
        """The slot file a new replica of `owner` replaces (the one not holding its newest)."""
        newest = self._newest_of(owner)
        return [self.path(owner, 1 - newest[0] if newest is not None else 0)]

    def _fill(
        self, tmp: Path, owner: int, step: int, nbytes: int, read: Reader, finish: Finish | None
    ) -> str | None:
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            try:
                os.posix_fallocate(fd, 0, nbytes)
            except OSError as exc:
                if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                    return f"no room for {nbytes} bytes: {exc.strerror}"
                os.ftruncate(fd, nbytes)  # a file system without fallocate: admissible() checked the room
            mm = mmap.mmap(fd, nbytes, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        header = bytearray(HEADER_BYTES)
        try:
            problem = _fill_and_check(mm, header, owner, step, nbytes, read, self, finish)
            if problem is None:
                mm[0:HEADER_BYTES] = header  # the header last: a torn file never reads as a snapshot
            return problem
        finally:
            mm.close()

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

    def take_damaged(self) -> list[tuple[int, int, str]]:
        """The damaged replicas found since the last call (owner, step, why)."""
        with self._lock:
            damaged, self.damaged = self.damaged, []
            return damaged

    def damage_all(self, owner: int) -> int:
        """Fault injection only (`replica-corrupt`): damage every replica of `owner` held here now and
        each one stored from now on (memory going bad at rest). Returns the files damaged now."""
        with self._lock:
            self.damage_owners.add(owner)
            paths = [self.path(owner, slot) for slot in (0, 1) if self.path(owner, slot).is_file()]
            for path in paths:
                damage(path)
            return len(paths)

    def _verified(self, owner: int) -> list[Held]:
        store = self.reader(owner)  # its offers() quarantine a damaged replica: reported once, here
        try:
            offers, rejected = store.offers()
            self.damaged += [(owner, r.step, r.reason) for r in rejected if r.corrupt]
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


def damage(path: Path) -> None:
    """Flip 64 bytes in the middle of a slot file's payload (fault injection: a copy damaged at rest)."""
    size = path.stat().st_size
    at = max(HEADER_BYTES, HEADER_BYTES + (size - HEADER_BYTES) // 2 - 32)
    with open(path, "r+b") as fh:
        fh.seek(at)
        chunk = fh.read(64)
        fh.seek(at)
        fh.write(bytes(b ^ 0xFF for b in chunk))


def _alive(pid: str) -> bool:
    try:
        os.kill(int(pid), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


def _fill_and_check(
    mm: mmap.mmap,
    header: bytearray,
    owner: int,
    step: int,
    nbytes: int,
    read: Reader,
    shelf: ReplicaShelf,
    finish: Finish | None = None,
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
            if finish is not None and (bad := finish()) is not None:
                return bad
            h, why = parse_header(header)
            if h is None:
                return f"header: {why}"
            return (
                (h.rank != owner and f"header of rank {h.rank}")
                or (h.step != step and f"header of step {h.step}")
                or (h.fingerprint != shelf.fingerprint and "another run")
                or (h.world_size != shelf.world_size and f"world size {h.world_size}")
                or (HEADER_BYTES + h.payload_bytes != nbytes and "length differs from its header")
                or (payload_checksum(payload) != h.checksum and "payload checksum mismatch")
                or None
            )
    except Exception as exc:  # the connection broke or timed out mid-transfer
        traceback.clear_frames(exc.__traceback__)
        return f"{type(exc).__name__}: {exc}"
