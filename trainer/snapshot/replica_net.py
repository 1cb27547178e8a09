"""The replication channel: a TCP server per rank, the two requests it answers, all authenticated.

- PUT (owner rank, step, n bytes): the owner streams its committed slot file; the server receives it
  into a temp file of its ReplicaShelf (outside the shelf's lock), verifies it and publishes it.
- GET (owner rank, step): the server streams the replica it holds of that owner's step, for a replaced
  node restoring from its peer.

Every request is a fixed-size header (requester rank, owner, step, size, time, a random nonce) followed
by its HMAC-SHA256 under the channel key (trainer/snapshot/replica.py: per job and per restore), and a
payload is followed by an HMAC over header and payload. The server checks, before reading anything
else or allocating anything: the MAC, the time (FRESH_S) and the nonce (no replay), then who may ask
(`may_put`: only the rank whose replica this holder keeps; `may_get`: a rank of the job for its own
replica), then the size (the shelf's budget). Replies are MACed the same way, bound to the request's
nonce. A request that fails any check is refused with a short error, the first refusal of each peer
address is logged, and the rank carries on. Connections are capped (MAX_CONNECTIONS), each with a
header timeout and an I/O timeout, and nothing holds the shelf's lock across network I/O.

Why not a process group: the channel must neither share a socket with the training collectives nor live
and die with them. Nothing read from the wire is unpickled: fixed-size structs, then raw bytes whose
MAC, header and payload checksum are verified before they count.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import os
import secrets
import socket
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path

from trainer.snapshot.replica_shelf import ReplicaShelf

log = logging.getLogger(__name__)

PROTOCOL = b"TRR2"
PUT, GET = 1, 2
OK, ERROR = 0, 1
_REQUEST = struct.Struct("<4sBxxxiiqqq16s")  # protocol, op, requester, owner, step, nbytes, time_ns, nonce
_REPLY = struct.Struct("<4sBxxxq16s")  # protocol, status, nbytes (data on GET, message on ERROR), nonce
MAC_BYTES = 32
CONNECT_TIMEOUT_S = 5.0
HEADER_TIMEOUT_S = 5.0
"""A connection that has not sent its whole authenticated header by then is dropped."""
IO_TIMEOUT_S = 120.0
"""A replica is GiBs at most; a transfer that stalls this long counts as failed (peer gone or wedged)."""
FRESH_S = 300.0
"""A request's time may differ from the server's clock by this much (node clock skew); its nonce is
remembered that long, so a recorded request cannot be replayed."""
MAX_CONNECTIONS = 8
"""Connections served at once; more are closed at accept (a holder needs one PUT and a few GETs)."""
MAX_ERROR_BYTES = 4096
LINGER_S, LINGER_BYTES = 0.5, 16 << 20
"""How long, and how much, a refused sender's bytes are read and dropped before the connection closes."""
_CHUNK = 8 << 20

Address = tuple[str, int]
Rule = Callable[[int, int], bool]
"""(requester, owner) -> allowed."""


class ReplicaError(RuntimeError):
    """The peer refused or did not complete a request (the message says why)."""


class _Refused(Exception):
    """A request that fails authentication or authorization (answered, logged once per peer)."""


def _mac(key: bytes, *parts: bytes | memoryview) -> hmac.HMAC:
    m = hmac.new(key, b"trainer replica v2\0", hashlib.sha256)
    for part in parts:
        m.update(part)
    return m


class ReplicaServer:
    """Serves PUT and GET for `shelf` on `host` (a port the kernel picks, held while open).

    `key` is None until the channel key is known (the first restore agreement): until then every
    request is refused. `may_put` / `may_get` say which authenticated requester may store or fetch
    which owner's replica."""

    def __init__(self, shelf: ReplicaShelf, host: str, *, may_put: Rule | None = None,
                 may_get: Rule | None = None, key: bytes | None = None) -> None:  # fmt: skip
        self.shelf = shelf
        self.key = key
        own = lambda requester, owner: requester == owner  # noqa: E731
        self.may_put: Rule = may_put or own
        self.may_get: Rule = may_get or own
        self.refused = 0
        """Requests refused (authentication, authorization, size, capacity): for tests and logs."""
        self._refused_from: set[str] = set()
        self._nonces: dict[bytes, float] = {}
        self._nonce_lock = threading.Lock()
        self._puts: dict[int, tuple[int, socket.socket]] = {}  # owner -> (sent_ns, conn) of its PUT in flight
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._sock = socket.create_server((host, 0))
        self.address: Address = (host, self._sock.getsockname()[1])
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name="replica-server", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._closed = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()

    def _serve(self) -> None:
        while not self._closed:
            try:
                conn, peer = self._sock.accept()
            except OSError:
                return  # closed
            if not self._slots.acquire(blocking=False):
                self._refuse(str(peer[0]), f"more than {MAX_CONNECTIONS} connections at once")
                conn.close()
                continue
            threading.Thread(
                target=self._handle, args=(conn, str(peer[0])), name="replica-conn", daemon=True
            ).start()

    def _refuse(self, peer: str, why: str) -> None:
        self.refused += 1
        if peer not in self._refused_from:
            self._refused_from.add(peer)
            log.warning("replica server %s:%d refused a request from %s: %s (further refusals from it "
                        "are counted, not logged)", *self.address, peer, why)  # fmt: skip

    def _handle(self, conn: socket.socket, peer: str) -> None:
        nonce, key = b"\0" * 16, self.key
        try:
            with conn:
                try:
                    raw = _recv_exact(conn, _REQUEST.size + MAC_BYTES, within_s=HEADER_TIMEOUT_S)
                    head = raw[: _REQUEST.size]
                    proto, op, requester, owner, step, nbytes, sent_ns, nonce = _REQUEST.unpack(head)
                    self._authenticate(proto, head, raw[_REQUEST.size :], key, sent_ns, nonce)
                    assert key is not None
                    self._authorize(op, requester, owner, step, nbytes)
                except (_Refused, OSError, ReplicaError) as exc:
                    self._refuse(peer, str(exc) or type(exc).__name__)
                    said = str(exc) if isinstance(exc, _Refused) else "bad request"
                    with contextlib.suppress(OSError):
                        _send_error(conn, f"refused: {said}", key, nonce)
                        _linger(conn)
                    return
                conn.settimeout(IO_TIMEOUT_S)
                try:
                    if op == PUT:
                        self._supersede(owner, conn, sent_ns)
                        reader = _MacReader(conn, _mac(key, head))
                        try:
                            self.shelf.receive(owner, step, nbytes, reader, finish=reader.finish)
                        finally:
                            with self._nonce_lock:
                                if self._puts.get(owner, (0, None))[1] is conn:
                                    del self._puts[owner]
                        _send_reply(conn, OK, 0, key, nonce)
                    else:
                        held = self.shelf.find(owner, step)
                        if held is None:
                            _send_error(
                                conn, f"no verified replica of rank {owner} step {step} here", key, nonce
                            )
                            return
                        reply = _send_reply(conn, OK, held.nbytes, key, nonce)
                        _send_file(conn, held.path, held.nbytes, _mac(key, reply))
                except (OSError, ValueError, ReplicaError) as exc:
                    log.warning("replica request of rank %d (owner %d step %d) failed: %s", requester, owner,
                                step, exc)  # fmt: skip
                    with contextlib.suppress(OSError):
                        _send_error(conn, str(exc), key, nonce)
                        # The sender may still have bytes on the way (a PUT refused on its checksum
                        # before its MAC was read): closing on unread bytes resets the connection, and
                        # the reset can discard the reply before the sender reads it (seen in make test).
                        _linger(conn)
        finally:
            self._slots.release()

    def _supersede(self, owner: int, conn: socket.socket, sent_ns: int) -> None:
        """A newer authenticated PUT of `owner` cuts off an older one still in flight (stalled, or
        outrun): the older fails at once and frees its temp file, the newer proceeds. Newer is by the
        owner's send time, not by which handler thread got here first: under load an older request's
        thread arrived second and cut off the newer one before its reply was sent (make test: the
        sender read end-of-stream instead of the refusal it was owed)."""
        with self._nonce_lock:
            current = self._puts.get(owner)
            if current is not None and current[0] > sent_ns:
                raise ReplicaError(f"a newer replica put of rank {owner} is in flight")
            self._puts[owner] = (sent_ns, conn)
        if current is not None:
            with contextlib.suppress(OSError):
                current[1].shutdown(socket.SHUT_RDWR)

    def _authenticate(self, proto: bytes, head: bytes, mac: bytes, key: bytes | None, sent_ns: int,
                      nonce: bytes) -> None:  # fmt: skip
        if proto != PROTOCOL:
            raise _Refused("not a replica request")
        if key is None:
            raise _Refused("no channel key yet (before the first restore agreement)")
        if not hmac.compare_digest(mac, _mac(key, head).digest()):
            raise _Refused("MAC does not verify (not a rank of this job, or another restore's key)")
        now = time.time()
        if abs(now - sent_ns / 1e9) > FRESH_S:
            raise _Refused(f"request time is more than {FRESH_S:.0f} s off")
        with self._nonce_lock:
            for old in [n for n, t in self._nonces.items() if now - t > 2 * FRESH_S]:
                del self._nonces[old]
            if nonce in self._nonces:
                raise _Refused("replayed request")
            self._nonces[nonce] = now

    def _authorize(self, op: int, requester: int, owner: int, step: int, nbytes: int) -> None:
        if not 0 <= owner < self.shelf.world_size or not 0 <= requester < self.shelf.world_size:
            raise _Refused(f"rank {requester} / owner {owner} outside this job's ranks")
        if step < 0:
            raise _Refused(f"negative step {step}")
        if op == PUT:
            if not self.may_put(requester, owner):
                raise _Refused(f"rank {requester} may not store rank {owner}'s replica here")
            problem = self.shelf.admissible(owner, nbytes)
            if problem is not None:
                raise _Refused(problem)
        elif op == GET:
            if not self.may_get(requester, owner):
                raise _Refused(f"rank {requester} may not fetch rank {owner}'s replica")
        else:
            raise _Refused(f"unknown request {op}")


class _MacReader:
    """Fills buffers from a socket and MACs what it read; `finish` checks the sender's trailer."""

    def __init__(self, sock: socket.socket, mac: hmac.HMAC) -> None:
        self.sock, self.mac = sock, mac

    def __call__(self, view: memoryview) -> None:
        _recv_into(self.sock, view)
        self.mac.update(view)

    def finish(self) -> str | None:
        trailer = _recv_exact(self.sock, MAC_BYTES)
        if not hmac.compare_digest(trailer, self.mac.digest()):
            return "payload checksum mismatch (HMAC-SHA256 of the transfer differs)"
        return None


def _request(op: int, requester: int, owner: int, step: int, nbytes: int, key: bytes) -> tuple[bytes, bytes]:
    nonce = secrets.token_bytes(16)
    head = _REQUEST.pack(PROTOCOL, op, requester, owner, step, nbytes, time.time_ns(), nonce)
    return head + _mac(key, head).digest(), nonce


def put(address: Address, owner: int, step: int, path: Path, nbytes: int, *, key: bytes,
        requester: int | None = None) -> None:  # fmt: skip
    """Send the slot file `path` (`nbytes`) as owner's snapshot of `step`; returns once the peer stored it."""
    requester = owner if requester is None else requester
    msg, nonce = _request(PUT, requester, owner, step, nbytes, key)
    with socket.create_connection(address, timeout=CONNECT_TIMEOUT_S) as sock:
        sock.settimeout(IO_TIMEOUT_S)
        sock.sendall(msg)
        try:
            _send_file(sock, path, nbytes, _mac(key, msg[: _REQUEST.size]))
        except OSError as exc:  # refused mid-send: the reply says why, if it arrived
            try:
                _check_reply(sock, key, nonce)
            except OSError:
                raise exc from None
            raise
        _check_reply(sock, key, nonce)


def get(address: Address, owner: int, step: int, into: ReplicaShelf, *, key: bytes,
        requester: int | None = None) -> int:  # fmt: skip
    """Fetch the peer's replica of owner's `step` into `into` (verified there); the slot it went to."""
    requester = owner if requester is None else requester
    msg, nonce = _request(GET, requester, owner, step, 0, key)
    with socket.create_connection(address, timeout=CONNECT_TIMEOUT_S) as sock:
        sock.settimeout(IO_TIMEOUT_S)
        sock.sendall(msg)
        nbytes, reply = _check_reply(sock, key, nonce, with_header=True)
        problem = into.admissible(owner, nbytes)
        if problem is not None:
            raise ReplicaError(f"replica refused before transfer: {problem}")
        reader = _MacReader(sock, _mac(key, reply))
        return into.receive(owner, step, nbytes, reader, finish=reader.finish)


def _linger(conn: socket.socket) -> None:
    """After refusing a request whose sender is still sending: stop writing and read a little of what
    comes (at most LINGER_BYTES, LINGER_S), so that the refusal reaches it rather than a reset."""
    conn.shutdown(socket.SHUT_WR)
    deadline, left = time.monotonic() + LINGER_S, LINGER_BYTES
    buf = bytearray(1 << 16)
    while left > 0 and (wait := deadline - time.monotonic()) > 0:
        conn.settimeout(wait)
        n = conn.recv_into(buf)
        if n == 0:
            return
        left -= n


def _send_reply(conn: socket.socket, status: int, nbytes: int, key: bytes | None, nonce: bytes) -> bytes:
    head = _REPLY.pack(PROTOCOL, status, nbytes, nonce)
    reply = head + (_mac(key, head).digest() if key is not None else b"\0" * MAC_BYTES)
    conn.sendall(reply)
    return reply


def _send_error(conn: socket.socket, message: str, key: bytes | None, nonce: bytes) -> None:
    raw = message.encode()[:MAX_ERROR_BYTES]
    _send_reply(conn, ERROR, len(raw), key, nonce)
    conn.sendall(raw)


def _check_reply(
    sock: socket.socket, key: bytes, nonce: bytes, *, with_header: bool = False
) -> tuple[int, bytes]:
    reply = _recv_exact(sock, _REPLY.size + MAC_BYTES)
    head = reply[: _REPLY.size]
    proto, status, nbytes, echoed = _REPLY.unpack(head)
    if proto != PROTOCOL:
        raise ReplicaError("not a replica server")
    if status != OK:
        text = _recv_exact(sock, min(max(nbytes, 0), MAX_ERROR_BYTES)).decode(errors="replace")
        raise ReplicaError(text)
    if echoed != nonce or not hmac.compare_digest(reply[_REPLY.size :], _mac(key, head).digest()):
        raise ReplicaError("reply not authenticated (not this job's replica server)")
    return int(nbytes), reply


def _send_file(sock: socket.socket, path: Path, nbytes: int, mac: hmac.HMAC) -> None:
    """Stream `nbytes` of `path`, MACed on the way, then the MAC (one read of the file for both)."""
    buf = bytearray(min(_CHUNK, max(nbytes, 1)))
    with open(path, "rb") as fh:
        if os.fstat(fh.fileno()).st_size < nbytes:
            raise ReplicaError(f"{path} is shorter than {nbytes} bytes (rewritten meanwhile)")
        left = nbytes
        with memoryview(buf) as view:
            while left:
                n = fh.readinto(view[: min(len(view), left)])
                if not n:
                    raise ReplicaError(f"{path} ended {left} bytes early")
                mac.update(view[:n])
                sock.sendall(view[:n])
                left -= n
    sock.sendall(mac.digest())


def _recv_into(sock: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:], len(view) - got)
        if n == 0:
            raise ReplicaError(f"peer closed the connection after {got} of {len(view)} bytes")
        got += n


def _recv_exact(sock: socket.socket, n: int, *, within_s: float | None = None) -> bytes:
    """`n` bytes; with `within_s`, all of them within that time (a peer trickling a byte at a time
    does not hold a connection for longer)."""
    buf = bytearray(n)
    if within_s is None:
        _recv_into(sock, memoryview(buf))
        return bytes(buf)
    deadline, got = time.monotonic() + within_s, 0
    with memoryview(buf) as view:
        while got < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ReplicaError(f"no complete request within {within_s:.0f} s")
            sock.settimeout(left)
            k = sock.recv_into(view[got:], n - got)
            if k == 0:
                raise ReplicaError(f"peer closed the connection after {got} of {n} bytes")
            got += k
    return bytes(buf)


def local_address(towards: str | None) -> str:
    """This host's IP on the route to `towards` (the rendezvous host: the pod network on a cluster)."""
    if towards:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
                probe.connect((towards, 9))  # UDP connect sends nothing; it only picks the route
                return str(probe.getsockname()[0])
        except OSError:
            pass
    return "127.0.0.1"
