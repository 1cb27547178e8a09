"""Per-rank, double-buffered host-memory snapshots in files on a tmpfs (the pod's /dev/shm).

A snapshot is one file per slot, `<dir>/rank<R>.slot<0|1>`: a 4 KiB header, then the payload (every
local tensor at an aligned offset, then the JSON skeleton of codec.py). A file on tmpfs is a named
shared-memory segment: its pages outlive the process that wrote it (a SIGKILLed worker's snapshot is
still there for the launcher's next worker), and cost host memory, never disk.

What makes a slot trustworthy:
- Double buffering: a write goes to the slot *not* holding the newest committed snapshot, so a fault at
  any moment of a write leaves the other slot whole.
- The header is written last. A write first zeroes the slot's magic, copies the tensors, and a helper
  thread computes the payload's checksum (checksum.py) and then writes the header (JSON + its own CRC)
  and the magic. A slot without its magic, or whose checksums do not match, is never loaded: every load
  checks the payload against the digest taken when the snapshot was made, before a byte of it is copied,
  the process's own slot (tier 1's restore from memory) included: a stray write or a bad DIMM corrupts
  a process's own pages as easily as another's.
- A slot that fails a check is quarantined (`quarantine`: its magic zeroed): no later restore, in this
  process or the next, meets the same bad copy again.
- The header says whose it is: run fingerprint, world size, rank and layout id. A snapshot of another
  run, world size or rank is refused (with the reason), never loaded.

What blocks the training loop is only the copy (plus, if the previous snapshot's checksum is still
being computed, the wait for it). A durable checkpoint of the same step may reuse the slot instead of
copying the live state again (trainer/checkpoint/from_snapshot.py): it *holds* the slot (`Reusable.hold`),
and a later write that would overwrite a held slot waits for its release (normally long past: the
reader copies the slot out during the next step). On a GPU the copy is a device-to-host memcpy into these
pages;
registering them as pinned memory lets it run asynchronously (see `pin`).
"""

from __future__ import annotations

import json
import logging
import mmap
import os
import queue
import struct
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from trainer.snapshot.checksum import payload_checksum
from trainer.state import codec

log = logging.getLogger(__name__)

HEADER_BYTES = 4096
MAGIC = b"TRSNAP01"
VERSION = 2
"""2: the payload's checksum is XXH3-128 (`checksum`), was zlib's CRC32 (`crc32`)."""
_LEN = struct.Struct("<I")


@dataclass(frozen=True)
class Header:
    step: int
    fingerprint: str
    world_size: int
    rank: int
    layout: str
    tensor_bytes: int
    skeleton_bytes: int
    checksum: str
    """checksum.payload_checksum of the payload."""
    pid: int
    written_at: float
    version: int = VERSION

    @property
    def payload_bytes(self) -> int:
        return self.tensor_bytes + self.skeleton_bytes


@dataclass(frozen=True)
class Offer:
    """A snapshot this rank can restore from: its header verified (run, world size, rank) and, unless
    `offers(verify_payload=False)` made it, its payload's checksum too (`load` checks it then)."""

    slot: int
    header: Header
    written_here: bool
    """Written by this very process (an in-process restart): the source is `memory`, else `shm`."""
    payload_verified: bool = True


@dataclass(frozen=True)
class Rejected:
    slot: int
    reason: str
    corrupt: bool = False
    """The slot failed an integrity check (header or payload checksum, length): a damaged copy, where
    an interrupted write or another run's file is not one."""
    step: int = -1
    """The step its header names (-1: no readable header)."""
    written_here: bool = False
    """Committed by this very process (a damaged copy of its own memory)."""


class CorruptCopy(ValueError):
    """A snapshot's bytes do not match the digest taken when it was made; raised before any of them was
    copied, so the caller may take the same step from its next source."""


@dataclass(frozen=True)
class WriteResult:
    blocked_s: float
    """Seconds the caller waited: wait_s + copy_s (Snapshots adds building the save dict)."""
    wait_s: float
    """Waiting for the previous snapshot's checksum and header (overlapped with a step, normally 0)."""
    copy_s: float
    bytes: int
    """Payload bytes of this snapshot (tensors + skeleton)."""
    reusable: Reusable | None = field(default=None, compare=False, repr=False)
    """The snapshot as a durable save of the same step may reuse it (set by Snapshots.after_step)."""


@dataclass(frozen=True)
class Reusable:
    """The snapshot just written, offered to a durable checkpoint of the same step.

    `save_dict` is the (live) save dict the slot was copied from: the checkpoint reads only its structure
    (DTensor placements), in the loop thread, before the next step changes anything. The bytes come from
    the slot, verified, through `SnapshotStore.read_held`.
    """

    store: SnapshotStore
    slot: int
    step: int
    commit: _Ticket | None
    save_dict: dict[str, Any]
    plan: codec.Plan | None = None
    """The save dict's codec.Plan (its tensors in the slot's order), kept by Snapshots while the live
    tensors stay put: a checkpoint reads the tensors' placements from it once per plan, not per save."""

    def hold(self) -> Hold:
        """Keep the slot from being overwritten until the returned hold is released (loop thread, before
        the next snapshot)."""
        return self.store.hold(self.slot, self.step, self.commit)


@dataclass
class Hold:
    """A slot a reader is copying out; `release` (idempotent) lets the next write have it."""

    store: SnapshotStore
    slot: int
    step: int
    commit: _Ticket | None
    released: bool = False

    def release(self) -> None:
        if not self.released:
            self.released = True
            self.store.release(self.slot)


class SnapshotStore:
    """One rank's two snapshot slots. Lives as long as the process (it survives in-process restarts)."""

    def __init__(self, directory: Path, *, rank: int, world_size: int, fingerprint: str) -> None:
        self.dir = Path(directory)
        self.rank, self.world_size, self.fingerprint = rank, world_size, fingerprint
        self.dir.mkdir(parents=True, exist_ok=True)
        self._maps: dict[int, _Mapping] = {}
        # slot -> (step, checksum) this process committed there: a header matching it is this process's own
        self._written_here: dict[int, tuple[int, str]] = {}
        self._pending: _Ticket | None = None
        self._commit_thread: _Committer | None = None
        """One long-lived commit thread: starting a thread per snapshot made the loop wait for the new
        thread to be scheduled (Thread.start), several ms a snapshot on a busy host."""
        self._view_cache: dict[int, tuple[_Mapping, list[codec.TensorSlot], list[torch.Tensor]]] = {}
        self.last_slot = -1
        """The slot the last write went to (its commit may still be running)."""
        self._pending_error: BaseException | None = None
        self._pinned = False
        self._held: dict[int, int] = {}  # slot -> readers holding it (Hold)
        self._held_cv = threading.Condition()
        self.on_commit: Callable[[int, int], None] | None = None
        """on_commit(slot, step), on the commit thread, once a slot became valid (peer replication)."""

    def path(self, slot: int) -> Path:
        return self.dir / f"rank{self.rank}.slot{slot}"

    # ------------------------------------------------------------------------------------------ write
    def write(
        self,
        step: int,
        save_dict: dict[str, Any],
        *,
        flat: codec.Flat | None = None,
        crash_after_bytes: int | None = None,
    ) -> WriteResult:
        """Copy `save_dict` (a checkpoint save dict) into the free slot; commit it in the background.

        `flat`: `save_dict` already flattened and planned (Snapshots keeps one per attempt, codec.Flat);
        computed here when None. `crash_after_bytes` is for tests: raise after copying that many tensor
        bytes (a fault mid-copy).
        """
        t0 = time.perf_counter()
        self.wait()
        t_wait = time.perf_counter()
        if flat is None:
            flat = codec.flat(save_dict)
        tensor_bytes = flat.tensor_bytes
        slot = self._free_slot()
        t_held = time.perf_counter()
        self._wait_unheld(slot)  # a durable save still copying this slot out (normally done long ago)
        held = time.perf_counter() - t_held
        skel = flat.payload_skeleton()
        m = self._mapping(slot, HEADER_BYTES + tensor_bytes + len(skel))
        assert m is not None  # with a size, a mapping is always made
        m.buf[0 : len(MAGIC)] = b"\0" * len(MAGIC)  # invalid from here until the header is rewritten
        self._written_here.pop(slot, None)
        if crash_after_bytes is not None:
            self._copy_until(m, flat, step, crash_after_bytes)
        else:
            dst, src = self._views(slot, m, flat)
            if dst:
                # one call for every tensor: no Python per tensor
                torch._foreach_copy_(dst, src, non_blocking=True)
        m.buf[HEADER_BYTES + tensor_bytes : HEADER_BYTES + tensor_bytes + len(skel)] = skel
        done = _copy_done_marker(flat.tensors)
        header = dict(
            step=step, fingerprint=self.fingerprint, world_size=self.world_size, rank=self.rank,
            layout=flat.layout(), tensor_bytes=tensor_bytes, skeleton_bytes=len(skel), pid=os.getpid(),
        )  # fmt: skip
        self._pending_error = None
        self._pending = self._committer().submit(slot, m, header, done)
        self.last_slot = slot
        wait_s = t_wait - t0 + held
        blocked = time.perf_counter() - t0  # the hand-off to the commit thread is the loop's wait too
        return WriteResult(blocked, wait_s, blocked - wait_s, tensor_bytes + len(skel))

    def _views(
        self, slot: int, m: _Mapping, flat: codec.Flat
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """(destination views in the slot, sources) of every non-empty tensor; kept per slot while the
        mapping and the plan are the same objects (a remap or a new plan rebuilds them)."""
        cached = self._view_cache.get(slot)
        if cached is not None and cached[0] is m and cached[1] is flat.slots:
            return cached[2], flat.sources
        dst = [
            m.view(HEADER_BYTES + s.offset, s.nbytes, t.dtype, s.shape)
            for t, s in zip(flat.tensors, flat.slots, strict=True)
            if s.nbytes
        ]
        self._view_cache[slot] = (m, flat.slots, dst)
        return dst, flat.sources

    def _copy_until(self, m: _Mapping, flat: codec.Flat, step: int, crash_after_bytes: int) -> None:
        """Tests only: the per-tensor copy, raising before the tensor that crosses `crash_after_bytes`."""
        copied = 0
        for t, s in zip(flat.tensors, flat.slots, strict=True):
            if copied + s.nbytes > crash_after_bytes:
                raise RuntimeError(f"injected crash after {copied} bytes of snapshot {step}")
            if s.nbytes:
                m.view(HEADER_BYTES + s.offset, s.nbytes, t.dtype, s.shape).copy_(t.detach())
            copied += s.nbytes

    def _committer(self) -> _Committer:
        if self._commit_thread is None or not self._commit_thread.alive:
            self._commit_thread = _Committer(self._commit, name=f"snapshot-commit-rank{self.rank}")
        return self._commit_thread

    # ------------------------------------------------------------------------------------------ holds
    HOLD_WAIT_S = 60.0
    """Longest a write waits for a reader to release the slot it needs (a reader only copies: a stuck
    one is a bug, reported as an error rather than a silent hang)."""

    @property
    def pending_commit(self) -> _Ticket | None:
        """The commit thread of the last write (None once waited for)."""
        return self._pending

    def hold(self, slot: int, step: int, commit: _Ticket | None) -> Hold:
        with self._held_cv:
            self._held[slot] = self._held.get(slot, 0) + 1
        return Hold(self, slot, step, commit)

    def release(self, slot: int) -> None:
        with self._held_cv:
            self._held[slot] = max(self._held.get(slot, 0) - 1, 0)
            self._held_cv.notify_all()

    HOLD_POLL_S = 0.05
    """The wait for a held slot sleeps in chunks this long. A fault on another rank reaches the loop
    thread as the in-process Wrapper's asynchronous exception, which Python delivers only between two
    waits: one long wait kept a rank here, behind a durable save's reader stuck in a collective with
    the faulted rank, until that collective's timeout (a tier-1 restart of seconds instead of a fraction
    of one)."""

    def _wait_unheld(self, slot: int, timeout_s: float | None = None) -> None:
        limit = self.HOLD_WAIT_S if timeout_s is None else timeout_s
        deadline = time.monotonic() + limit
        with self._held_cv:
            while self._held.get(slot):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RuntimeError(f"snapshot slot {slot} still held by a reader after {limit} s")
                self._held_cv.wait(min(left, self.HOLD_POLL_S))

    def read_held(self, hold: Hold, take: Callable[[int, torch.Tensor], None]) -> Any:
        """In a reader's thread: wait for the held write's commit, verify the slot (its header: this run,
        rank and step), hand `take(i, view)` every tensor's view in order, then verify the payload
        checksum and that the header did not change: what `take` copied are the verified bytes (nothing
        in this process writes a held slot). Returns the JSON skeleton (codec.decode rebuilds the state
        from it). Raises ValueError when the slot is not the held snapshot, or not whole."""
        if hold.released:
            raise ValueError("snapshot hold already released")
        if hold.commit is not None:
            hold.commit.join()
        header, reason = self._read_header(hold.slot)
        if header is None:
            raise ValueError(f"snapshot slot {hold.slot}: {reason or 'missing'}")
        problem = self._refusal(header) or (
            f"holds step {header.step}, not {hold.step}" if header.step != hold.step else None
        )
        if problem is not None:
            raise ValueError(f"snapshot slot {hold.slot}: {problem}")
        m, meta = self._contents(hold.slot, header)
        for i, s in enumerate(meta["tensors"]):
            dtype = codec.dtype_of(s["dtype"])
            take(i, m.view(HEADER_BYTES + s["offset"], s["nbytes"], dtype, tuple(s["shape"])))
        problem = self._payload_problem(hold.slot, header)
        if problem is None and self._read_header(hold.slot)[0] != header:
            problem = "changed while being read"
        if problem is not None:
            raise ValueError(f"snapshot slot {hold.slot}: {problem}")
        return meta["skeleton"]

    def _commit(self, slot: int, m: _Mapping, fields: dict[str, Any], done: Any) -> None:
        try:
            if done is not None:
                done.synchronize()  # the asynchronous device-to-host copies have landed
            end = HEADER_BYTES + fields["tensor_bytes"] + fields["skeleton_bytes"]
            digest = payload_checksum(m.buf[HEADER_BYTES:end])  # releases the GIL: overlaps the next step
            body = json.dumps({**fields, "checksum": digest, "written_at": time.time(), "version": VERSION})
            raw = body.encode()
            if len(MAGIC) + 2 * _LEN.size + len(raw) > HEADER_BYTES:
                raise ValueError("snapshot header does not fit in its 4 KiB")
            at = len(MAGIC)
            m.buf[at : at + _LEN.size] = _LEN.pack(len(raw))
            m.buf[at + _LEN.size : at + _LEN.size + len(raw)] = raw
            tail = at + _LEN.size + len(raw)
            m.buf[tail : tail + _LEN.size] = _LEN.pack(zlib.crc32(raw))
            m.buf[0 : len(MAGIC)] = MAGIC  # the moment the slot becomes valid
            self._written_here[slot] = (int(fields["step"]), digest)
            if self.on_commit is not None:
                self.on_commit(slot, int(fields["step"]))
        except BaseException as exc:  # reported by the next wait(); the slot stays invalid
            self._pending_error = exc

    def wait(self) -> None:
        """Wait until the last write is committed. A failed commit is logged: that slot stays invalid."""
        if self._pending is not None:
            self._pending.join()
            self._pending = None
            if self._pending_error is not None:
                log.warning("snapshot commit failed (slot left invalid): %s", self._pending_error)
                self._pending_error = None

    def _free_slot(self) -> int:
        """The slot not holding the newest valid snapshot (slot 0 when neither holds one)."""
        headers = {slot: self._read_header(slot)[0] for slot in (0, 1)}
        steps = {slot: (h.step if h is not None else -2) for slot, h in headers.items()}
        return 1 if steps[0] > steps[1] else 0

    # ------------------------------------------------------------------------------------------- read
    def offers(self, *, verify_payload: bool = True) -> tuple[list[Offer], list[Rejected]]:
        """Verified snapshots of this run and rank, newest first, and why the others were refused.

        With `verify_payload=False` the payloads' checksums are left to `load`: a restore reads one
        slot of the two, and checking both before the agreement doubled its time (a failed check in
        `load` raises CorruptCopy before any byte is copied). A slot that fails an integrity check here
        is quarantined (`Rejected.corrupt`)."""
        self.wait()
        good, bad = [], []
        for slot in (0, 1):
            header, reason = self._read_header(slot)
            if header is None:
                if reason is not None:
                    damaged = reason not in (INCOMPLETE,)
                    bad.append(Rejected(slot, reason, damaged))
                    if damaged:
                        self.quarantine(slot)
                continue
            refusal = self._refusal(header)
            reason = refusal or self._payload_problem(slot, header, verify_payload)
            ours = self._written_here.get(slot) == (header.step, header.checksum)
            here = ours and header.pid == os.getpid()
            if reason is not None:
                bad.append(Rejected(slot, reason, refusal is None, header.step, here))
                if refusal is None:
                    self.quarantine(slot)
                continue
            good.append(Offer(slot, header, here, verify_payload))
        good.sort(key=lambda o: o.header.step, reverse=True)
        return good, bad

    def _refusal(self, h: Header) -> str | None:
        if h.version != VERSION:
            return f"format version {h.version}, expected {VERSION}"
        if h.fingerprint != self.fingerprint:
            return f"another run (fingerprint {h.fingerprint}, this run {self.fingerprint})"
        if h.world_size != self.world_size:
            return f"world size {h.world_size}, this run has {self.world_size}"
        if h.rank != self.rank:
            return f"rank {h.rank}'s snapshot, this is rank {self.rank}"
        return None

    def _payload_problem(self, slot: int, h: Header, checksum: bool = True) -> str | None:
        m = self._mapping(slot, None)
        end = HEADER_BYTES + h.payload_bytes
        if m is None or m.size < end:
            return "payload truncated"
        if checksum and payload_checksum(m.buf[HEADER_BYTES:end]) != h.checksum:
            return "payload checksum mismatch"
        return None

    def load(self, offer: Offer, template: dict[str, Any], expected_layout: str) -> dict[str, Any]:
        """The template filled from the offered snapshot (tensors copied in place). Raises ValueError
        when the layout differs (another model, optimizer or sharding) or the slot changed meanwhile."""
        h = offer.header
        if h.layout != expected_layout:
            raise ValueError(f"snapshot layout {h.layout} differs from this run's {expected_layout}")
        if not offer.payload_verified:
            self.verify(offer)
        m, meta = self._contents(offer.slot, h)
        slots = [
            codec.TensorSlot(s["dtype"], tuple(s["shape"]), s["offset"], s["nbytes"]) for s in meta["tensors"]
        ]

        def source(i: int) -> torch.Tensor:
            s = slots[i]
            return m.view(HEADER_BYTES + s.offset, s.nbytes, codec.dtype_of(s.dtype), s.shape)

        filled = codec.fill(template, meta["skeleton"], source)
        current, _ = self._read_header(offer.slot)
        if current != h:  # the bytes were overwritten while being read: never expected, never silent
            raise ValueError("snapshot slot changed while loading")
        return filled

    def verify(self, offer: Offer) -> None:
        """Check the offered slot's header and payload against the digest taken when it was written;
        raise CorruptCopy (and quarantine the slot) when they differ. Reads the whole payload once."""
        current, reason = self._read_header(offer.slot)
        problem = reason if current is None else None
        if current is not None and current != offer.header:
            problem = f"header changed since offered (step {current.step}, was {offer.header.step})"
        problem = problem or self._payload_problem(offer.slot, offer.header)
        if problem is not None:
            self.quarantine(offer.slot)
            raise CorruptCopy(f"snapshot slot {offer.slot} of step {offer.header.step}: {problem}")

    def damage_newest(self) -> int | None:
        """Fault injection only (`snapshot-corrupt`): flip bytes in the newest committed slot's payload,
        leaving its header whole (a copy damaged at rest). The slot damaged, or None without one."""
        self.wait()
        offers, _ = self.offers(verify_payload=False)
        if not offers:
            return None
        h, slot = offers[0].header, offers[0].slot
        m = self._mapping(slot, None)
        assert m is not None
        at = HEADER_BYTES + h.payload_bytes // 2
        end = min(at + 64, HEADER_BYTES + h.payload_bytes)
        m.buf[at:end] = bytes(b ^ 0xFF for b in m.buf[at:end])
        return slot

    def quarantine(self, slot: int) -> None:
        """Invalidate a slot that failed a check (its magic zeroed): never offered or hashed again; the
        next write reuses it."""
        m = self._mapping(slot, None)
        if m is not None and m.size >= len(MAGIC):
            m.buf[0 : len(MAGIC)] = b"\0" * len(MAGIC)
        self._written_here.pop(slot, None)

    def _contents(self, slot: int, header: Header) -> tuple[_Mapping, dict[str, Any]]:
        """The slot's mapping and its JSON metadata (the tensors' places and the skeleton), as `header`
        describes them. Raises ValueError when the slot is gone."""
        m = self._mapping(slot, None)
        if m is None:
            raise ValueError("snapshot slot disappeared")
        start = HEADER_BYTES + header.tensor_bytes
        return m, json.loads(bytes(m.buf[start : start + header.skeleton_bytes]))

    def _read_header(self, slot: int) -> tuple[Header | None, str | None]:
        """(header, None) for a committed slot; (None, reason) for a damaged one; (None, None) if absent."""
        m = self._mapping(slot, None)
        if m is None:
            return None, None
        if m.size < HEADER_BYTES:
            return None, INCOMPLETE
        return parse_header(m.buf[0:HEADER_BYTES])

    # ------------------------------------------------------------------------------------ maintenance
    def discard_newer_than(self, step: int) -> None:
        """Invalidate slots newer than `step` (after restoring an older state, they are another past)."""
        self.wait()  # a commit still in flight would otherwise validate its slot after this
        for slot in (0, 1):
            h, _ = self._read_header(slot)
            if h is not None and h.step > step:
                m = self._mapping(slot, None)
                if m is not None:
                    m.buf[0 : len(MAGIC)] = b"\0" * len(MAGIC)
                self._written_here.pop(slot, None)

    def pin(self) -> None:
        """Register the slots with CUDA as page-locked memory (async D2H copies); a no-op on CPU."""
        self._pinned = torch.cuda.is_available()
        for m in self._maps.values():
            m.pin(self._pinned)

    def remove(self) -> None:
        """Delete this rank's slot files (a completed run frees the pod's memory)."""
        self.close()
        for slot in (0, 1):
            self.path(slot).unlink(missing_ok=True)

    def close(self) -> None:
        self.wait()
        if self._commit_thread is not None:
            self._commit_thread.stop()
            self._commit_thread = None
        try:
            for slot in (0, 1):
                self._wait_unheld(slot, timeout_s=5.0)  # a reader copying out (its save is being aborted)
        except RuntimeError as exc:
            log.warning("closing snapshots under a reader: %s", exc)
        maps, self._maps = list(self._maps.values()), {}
        self._view_cache.clear()  # views keep a mapping's buffer exported (it could not be closed)
        for m in maps:
            m.close()

    def _mapping(self, slot: int, size: int | None) -> _Mapping | None:
        """The slot's mapping; with `size`, created or resized to exactly that size."""
        m = self._maps.get(slot)
        if m is not None and m.closed:  # an asynchronous exception (the Wrapper's) cut a resize short
            del self._maps[slot]
            self._view_cache.pop(slot, None)
            m = None
        if size is None:
            if m is None and self.path(slot).exists() and self.path(slot).stat().st_size > 0:
                m = self._maps[slot] = _Mapping(self.path(slot), None)
            return m
        if m is None or m.size != size:
            if m is not None:
                del self._maps[slot]  # never leave a closed mapping reachable
                self._view_cache.pop(slot, None)
                m.close()
            m = self._maps[slot] = _Mapping(self.path(slot), size)
            m.pin(self._pinned)
        return m


INCOMPLETE = "incomplete (a write was interrupted)"
"""A slot without its magic: a write cut short, or a slot quarantined or discarded (not a damaged copy)."""


def parse_header(buf: Any) -> tuple[Header | None, str | None]:
    """The header in the first HEADER_BYTES of a slot: (header, None), or (None, why it is not valid)."""
    if bytes(buf[0 : len(MAGIC)]) != MAGIC:
        return None, INCOMPLETE
    at = len(MAGIC)
    (n,) = _LEN.unpack(buf[at : at + _LEN.size])
    if n > HEADER_BYTES - at - 2 * _LEN.size:
        return None, "header length out of range"
    raw = bytes(buf[at + _LEN.size : at + _LEN.size + n])
    (crc,) = _LEN.unpack(buf[at + _LEN.size + n : at + 2 * _LEN.size + n])
    if zlib.crc32(raw) != crc:
        return None, "header checksum mismatch"
    try:
        return Header(**json.loads(raw)), None
    except (TypeError, ValueError) as exc:
        return None, f"unreadable header: {exc}"


class _Mapping:
    """A shared, writable mmap of one slot file, with a uint8 tensor over it for typed views."""

    def __init__(self, path: Path, size: int | None) -> None:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            if size is not None:
                os.ftruncate(fd, size)
            self.size = size if size is not None else os.fstat(fd).st_size
            self.mm = mmap.mmap(fd, self.size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        finally:
            os.close(fd)
        self.buf = memoryview(self.mm)
        self.bytes = torch.frombuffer(self.mm, dtype=torch.uint8)
        self._registered = False
        self.closed = False

    def view(self, offset: int, nbytes: int, dtype: torch.dtype, shape: tuple[int, ...]) -> torch.Tensor:
        return self.bytes[offset : offset + nbytes].view(dtype).view(shape)

    def pin(self, on: bool) -> None:
        if on and not self._registered:
            rc = torch.cuda.cudart().cudaHostRegister(self.bytes.data_ptr(), self.size, 0)
            self._registered = int(rc) == 0
            if not self._registered:
                # The failure stays the CUDA runtime's "last error" of this thread, and torch's check after
                # the next kernel launch raised it as that kernel's ("CUDA error: invalid argument", every
                # step, on an H200 whose runtime refuses to register /dev/shm mappings): clear it here.
                cleared = _clear_cuda_last_error()
                log.warning(
                    "cudaHostRegister of a snapshot slot failed (%s; error %s): copies stay synchronous",
                    rc,
                    "cleared" if cleared else "NOT cleared: the next CUDA call may report it",
                )

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self._registered:
            torch.cuda.cudart().cudaHostUnregister(self.bytes.data_ptr())
            self._registered = False
        del self.bytes
        try:
            self.buf.release()
            self.mm.close()
        except BufferError:  # a view is still referenced somewhere: the mapping goes when it does
            log.debug("snapshot mapping still in use at close")


def _clear_cuda_last_error() -> bool:
    """Reset this thread's CUDA runtime error (cudaGetLastError) in the libcudart torch has loaded; torch's
    cudart bindings have no cudaGetLastError. False when no loaded libcudart is found."""
    import ctypes

    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "libcudart.so" in line}
        for path in sorted(paths):
            ctypes.CDLL(path).cudaGetLastError()
        return bool(paths)
    except OSError as exc:
        log.debug("could not clear the CUDA error: %s", exc)
        return False


def _copy_done_marker(tensors: list[torch.Tensor]) -> Any:
    """A CUDA event after the device-to-host copies (None on CPU, where the copies are synchronous)."""
    if any(t.is_cuda for t in tensors):
        event = torch.cuda.Event()
        event.record()
        return event
    return None


class _Ticket:
    """One submitted commit: `join` waits for it (what Thread.join was to a thread per commit)."""

    def __init__(self) -> None:
        self._done = threading.Event()

    def join(self, timeout: float | None = None) -> None:
        self._done.wait(timeout)

    def is_alive(self) -> bool:
        return not self._done.is_set()


class _Committer:
    """The store's commit thread: runs each submitted commit in order; a daemon, so a worker that ends
    without closing its store is not kept alive by it."""

    def __init__(self, commit: Callable[..., None], *, name: str) -> None:
        self._commit = commit
        self._queue: queue.SimpleQueue[tuple[_Ticket, tuple[Any, ...]] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def submit(self, *args: Any) -> _Ticket:
        ticket = _Ticket()
        self._queue.put((ticket, args))
        return ticket

    def stop(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=5.0)

    def _run(self) -> None:
        while (item := self._queue.get()) is not None:
            ticket, args = item
            try:
                self._commit(*args)  # catches everything itself (reported by the next wait())
            finally:
                ticket._done.set()
