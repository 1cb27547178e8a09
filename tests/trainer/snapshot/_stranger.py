"""A stranger on the same host as a live run (a helper run as its own process by
test_replica_stranger.py): it knows the replica servers' addresses but not the job's key. Against each
server it tries a GET of every rank's replica, a PUT under a guessed key, a PUT announcing 2^62 bytes, a
negative owner, garbage, and idle connections; it prints one JSON line: how each attempt was answered.
It then holds `stall` connections open for `hold_s` seconds (sending half a header), and exits."""

from __future__ import annotations

import json
import secrets
import socket
import sys
import time

from trainer.snapshot import replica_net


def _answer(address: tuple[str, int], msg: bytes) -> str:
    try:
        with socket.create_connection(address, timeout=5) as sock:
            sock.settimeout(10)
            sock.sendall(msg)
            head = replica_net._recv_exact(sock, replica_net._REPLY.size)
            return "ok" if replica_net._REPLY.unpack(head)[1] == replica_net.OK else "refused"
    except (OSError, replica_net.ReplicaError):
        return "closed"


def main() -> None:
    addresses = [(h, int(p)) for h, p in (a.rsplit(":", 1) for a in sys.argv[1].split(","))]
    stall, hold_s = int(sys.argv[2]), float(sys.argv[3])
    guess = secrets.token_bytes(32)
    answers = []
    for address in addresses:
        for owner in range(len(addresses)):
            answers.append(
                _answer(address, replica_net._request(replica_net.GET, owner, owner, 0, 0, guess)[0])
            )
            for step in range(8):
                answers.append(
                    _answer(address, replica_net._request(replica_net.GET, owner, owner, step, 0, guess)[0])
                )
            put, _ = replica_net._request(replica_net.PUT, owner, owner, 99, 1 << 16, guess)
            answers.append(_answer(address, put + secrets.token_bytes(1 << 16)))
            answers.append(
                _answer(address, replica_net._request(replica_net.PUT, owner, owner, 99, 1 << 62, guess)[0])
            )
        answers.append(_answer(address, replica_net._request(replica_net.PUT, -1, -1, 99, 1 << 16, guess)[0]))
        answers.append(_answer(address, b"\0" * (replica_net._REQUEST.size + replica_net.MAC_BYTES)))
    held = []
    for address in addresses:
        for _ in range(stall):
            sock = socket.create_connection(address, timeout=5)
            sock.sendall(b"TRR2" + b"\0" * 20)
            held.append(sock)
    print(json.dumps({"answers": answers}), flush=True)
    time.sleep(hold_s)
    for sock in held:
        sock.close()


if __name__ == "__main__":
    main()
