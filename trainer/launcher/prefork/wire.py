"""The zygote's protocol, one Unix stream connection per worker start.

client -> zygote: one request: a 4-byte big-endian length, then that many bytes of JSON
    {"module": ..., "argv": [...], "env": {...}, "cwd": ..., "launcher_pid": ...}; its first chunk
    carries, as SCM_RIGHTS, the client's stdin, stdout and stderr, the read end of its lifeline pipe and
    the write end of its status pipe (in that order). The worker writes its exit status to the status
    pipe (ASCII digits) as it exits: the client's only source of it when the zygote died first.
zygote -> client: b"P" + the worker's PID (8 bytes), then b"X" + its raw wait status (8 bytes) when it
    has been reaped. Fixed-size records and JSON only: nothing on this socket is unpickled.
"""

from __future__ import annotations

import json
import os
import socket
import struct
from typing import Any

FDS_PER_REQUEST = 5
MAX_REQUEST_BYTES = 4 << 20  # argv + environment; a real environment is a few KiB
_LENGTH = struct.Struct("!I")
_RECORD = struct.Struct("!cq")


class ProtocolError(RuntimeError):
    """The peer sent something this protocol does not allow, or went away mid-message."""


def send_request(sock: socket.socket, request: dict[str, Any], fds: list[int]) -> None:
    body = json.dumps(request).encode()
    socket.send_fds(sock, [_LENGTH.pack(len(body))], fds)
    sock.sendall(body)


def recv_request(sock: socket.socket) -> tuple[dict[str, Any], list[int]]:
    """The request and the received fds (the caller owns and closes them)."""
    head, fds, _flags, _addr = socket.recv_fds(sock, _LENGTH.size, FDS_PER_REQUEST)
    try:
        if len(head) != _LENGTH.size or len(fds) != FDS_PER_REQUEST:
            raise ProtocolError(f"bad request header ({len(head)} bytes, {len(fds)} fds)")
        (length,) = _LENGTH.unpack(head)
        if length > MAX_REQUEST_BYTES:
            raise ProtocolError(f"request of {length} bytes")
        request = json.loads(_recv_exact(sock, length))
        if not isinstance(request, dict):
            raise ProtocolError("request is not a JSON object")
        return request, fds
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise


def send_record(sock: socket.socket, kind: bytes, value: int) -> None:
    sock.sendall(_RECORD.pack(kind, value))


def recv_record(sock: socket.socket) -> tuple[bytes, int] | None:
    """The next record, or None when the zygote closed the connection (it died)."""
    data = _recv_exact(sock, _RECORD.size, eof_ok=True)
    if not data:
        return None
    kind, value = _RECORD.unpack(data)
    return kind, value


def _recv_exact(sock: socket.socket, n: int, *, eof_ok: bool = False) -> bytes:
    chunks, got = [], 0
    while got < n:
        chunk = sock.recv(n - got)
        if not chunk:
            if eof_ok and got == 0:
                return b""
            raise ProtocolError(f"connection closed after {got} of {n} bytes")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)
