"""The replication channel: a plain TCP server per rank, and the two requests it answers.

- PUT (owner rank, step, n bytes): the owner streams its committed slot file (sendfile, no copy in user
  space); the server writes it into its ReplicaShelf (double buffered, verified) and answers OK or why not.
- GET (owner rank, step): the server streams the replica it holds of that owner's step, for a replaced
  node restoring from its peer.

Why not a process group: the channel must neither share a socket with the training collectives nor live
and die with them. A gloo group is built collectively, torn down with every in-process restart and
wedged by a dead member; this server is one thread per process, reached by address, and a lost peer only
fails the requests to it. Nothing read from the wire is unpickled: fixed-size structs, then raw bytes
whose header and payload checksums are verified before they count.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import struct
import threading
from pathlib import Path

from trainer.snapshot.replica_shelf import ReplicaShelf

log = logging.getLogger(__name__)

PROTOCOL = b"TRR1"
PUT, GET = 1, 2
OK, ERROR = 0, 1
_REQUEST = struct.Struct("<4sBxxxiqq")  # protocol, op, owner, step, nbytes (PUT)
_REPLY = struct.Struct("<4sBxxxq")  # protocol, status, nbytes (data on GET, message on ERROR)
CONNECT_TIMEOUT_S = 5.0
IO_TIMEOUT_S = 120.0
"""A replica is GiBs at most; past this a transfer counts as failed (the peer is gone or wedged)."""

Address = tuple[str, int]


class ReplicaError(RuntimeError):
    """The peer refused or did not complete a request (the message says why)."""


class ReplicaServer:
    """Accepts PUT and GET requests for `shelf` on `host` (a port the kernel picks, held while open)."""

    def __init__(self, shelf: ReplicaShelf, host: str) -> None:
        self.shelf = shelf
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
                conn, _ = self._sock.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._handle, args=(conn,), name="replica-conn", daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(IO_TIMEOUT_S)
            try:
                proto, op, owner, step, nbytes = _REQUEST.unpack(_recv_exact(conn, _REQUEST.size))
                if proto != PROTOCOL:
                    return
                if op == PUT:
                    self.shelf.receive(owner, step, nbytes, lambda view: _recv_into(conn, view))
                    conn.sendall(_REPLY.pack(PROTOCOL, OK, 0))
                elif op == GET:
                    held = self.shelf.find(owner, step)
                    if held is None:
                        _send_error(conn, f"no verified replica of rank {owner} step {step} here")
                        return
                    conn.sendall(_REPLY.pack(PROTOCOL, OK, held.nbytes))
                    _send_file(conn, held.path, held.nbytes)
            except (OSError, ValueError, ReplicaError, struct.error) as exc:
                log.warning("replica request failed: %s", exc)
                with contextlib.suppress(OSError):
                    _send_error(conn, str(exc))


def put(address: Address, owner: int, step: int, path: Path, nbytes: int) -> None:
    """Send the slot file `path` (`nbytes`) as owner's snapshot of `step`; returns once the peer stored it."""
    with socket.create_connection(address, timeout=CONNECT_TIMEOUT_S) as sock:
        sock.settimeout(IO_TIMEOUT_S)
        sock.sendall(_REQUEST.pack(PROTOCOL, PUT, owner, step, nbytes))
        _send_file(sock, path, nbytes)
        _check_reply(sock)


def get(address: Address, owner: int, step: int, into: ReplicaShelf) -> int:
    """Fetch the peer's replica of owner's `step` into `into` (verified there); the slot it went to."""
    with socket.create_connection(address, timeout=CONNECT_TIMEOUT_S) as sock:
        sock.settimeout(IO_TIMEOUT_S)
        sock.sendall(_REQUEST.pack(PROTOCOL, GET, owner, step, 0))
        nbytes = _check_reply(sock)
        return into.receive(owner, step, nbytes, lambda view: _recv_into(sock, view))


def _check_reply(sock: socket.socket) -> int:
    proto, status, nbytes = _REPLY.unpack(_recv_exact(sock, _REPLY.size))
    if proto != PROTOCOL:
        raise ReplicaError("not a replica server")
    if status != OK:
        raise ReplicaError(_recv_exact(sock, min(nbytes, 4096)).decode(errors="replace"))
    return int(nbytes)


def _send_error(conn: socket.socket, message: str) -> None:
    raw = message.encode()[:4096]
    conn.sendall(_REPLY.pack(PROTOCOL, ERROR, len(raw)) + raw)


def _send_file(sock: socket.socket, path: Path, nbytes: int) -> None:
    """sendfile from tmpfs: the kernel copies the pages straight into the socket."""
    with open(path, "rb") as fh:
        if os.fstat(fh.fileno()).st_size < nbytes:
            raise ReplicaError(f"{path} is shorter than {nbytes} bytes (rewritten meanwhile)")
        sent = sock.sendfile(fh, 0, nbytes)
    if sent != nbytes:
        raise ReplicaError(f"sent {sent} of {nbytes} bytes of {path}")


def _recv_into(sock: socket.socket, view: memoryview) -> None:
    got = 0
    while got < len(view):
        n = sock.recv_into(view[got:], len(view) - got)
        if n == 0:
            raise ReplicaError(f"peer closed the connection after {got} of {len(view)} bytes")
        got += n


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    _recv_into(sock, memoryview(buf))
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
