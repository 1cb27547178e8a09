"""The replica channel refuses what is not its job's (trainer/snapshot/replica_net.py, replica_shelf.py):
strangers (no key, wrong key, replays), ranks asking for what is not theirs, and sizes past the budget,
all before anything is allocated; a failed, oversized or stalled PUT leaves no file and blocks nobody.
One process, real sockets on 127.0.0.1. The live multi-rank run with a stranger is
tests/trainer/snapshot/test_replica_stranger.py.
"""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path

import pytest
import torch

from trainer.snapshot import replica_net
from trainer.snapshot.replica_shelf import ReplicaShelf
from trainer.snapshot.store import HEADER_BYTES, SnapshotStore
from trainer.state.save_dict import build_save_dict

KEY = b"k" * 32


def _owner_file(root: Path, rank: int, step: int) -> tuple[SnapshotStore, Path, int]:
    store = SnapshotStore(root / f"owner{rank}", rank=rank, world_size=4, fingerprint="run")
    store.write(step, build_save_dict({"model": torch.nn.Linear(32, 32)}, rank))
    store.wait()
    (offer,) = [o for o in store.offers()[0] if o.header.step == step]
    path = store.path(offer.slot)
    return store, path, path.stat().st_size


def _leftovers(shelf: ReplicaShelf) -> list[str]:
    return sorted(p.name for p in shelf.dir.iterdir() if not p.name.startswith("rank"))


@pytest.fixture()
def holder(tmp_path: Path):  # type: ignore[no-untyped-def]
    """Rank 2's server: it keeps rank 0's replica (the ring), in a shelf with a 1 MiB slot budget."""
    shelf = ReplicaShelf(tmp_path / "holder", world_size=4, fingerprint="run")
    shelf.limit = 1 << 20
    server = replica_net.ReplicaServer(
        shelf, "127.0.0.1", key=KEY, may_put=lambda req, owner: req == owner == 0
    )
    yield shelf, server
    server.close()


def test_strangers_and_other_ranks_are_refused_and_the_owner_is_served(tmp_path: Path, holder) -> None:  # type: ignore[no-untyped-def]
    shelf, server = holder
    store, path, nbytes = _owner_file(tmp_path, 0, 5)
    pulled = ReplicaShelf(tmp_path / "pulled", world_size=4, fingerprint="run")
    put, get = replica_net.put, replica_net.get
    other = b"x" * 32
    refusals = [  # (what, call, error it gets)
        ("PUT under another key", lambda: put(server.address, 0, 5, path, nbytes, key=other), "MAC"),
        ("GET under another key", lambda: get(server.address, 0, 5, pulled, key=other), "MAC"),
        ("PUT by a rank for another", lambda: put(server.address, 0, 5, path, nbytes, key=KEY, requester=1),
         "may not store"),
        ("PUT by a rank it does not keep", lambda: put(server.address, 1, 5, path, nbytes, key=KEY),
         "may not store"),
        ("PUT of a negative owner", lambda: put(server.address, -3, 5, path, nbytes, key=KEY, requester=-3),
         "outside"),
        ("PUT of an owner past the job", lambda: put(server.address, 9, 5, path, nbytes, key=KEY, requester=9),  # noqa: E501
         "outside"),
    ]  # fmt: skip
    for what, call, error in refusals:
        with pytest.raises(replica_net.ReplicaError, match=error):
            call()
        assert shelf.held() == [] and _leftovers(shelf) == [], what
    assert server.refused == len(refusals)

    replica_net.put(server.address, 0, 5, path, nbytes, key=KEY)
    assert [(h.owner, h.step) for h in shelf.held()] == [(0, 5)]
    # a rank fetches only its own replica
    with pytest.raises(replica_net.ReplicaError, match="may not fetch"):
        replica_net.get(server.address, 0, 5, pulled, key=KEY, requester=3)
    replica_net.get(server.address, 0, 5, pulled, key=KEY)
    assert pulled.find(0, 5) is not None

    # a recorded request replayed byte for byte is refused (its nonce was seen)
    msg, _ = replica_net._request(replica_net.GET, 0, 0, 5, 0, KEY)
    for expect_ok in (True, False):
        with socket.create_connection(server.address) as sock:
            sock.sendall(msg)
            reply = replica_net._recv_exact(sock, replica_net._REPLY.size)
            assert replica_net._REPLY.unpack(reply)[1] == (replica_net.OK if expect_ok else replica_net.ERROR)
    # garbage and a server without a key yet: refused, the server keeps serving
    with socket.create_connection(server.address) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\n" * 8)
    server.key = None
    with pytest.raises(replica_net.ReplicaError, match="no channel key"):
        replica_net.get(server.address, 0, 5, pulled, key=KEY)
    server.key = KEY
    replica_net.get(server.address, 0, 5, pulled, key=KEY)
    store.close()


@pytest.mark.parametrize("nbytes", [1 << 62, (1 << 20) + 1, HEADER_BYTES])
def test_oversized_puts_are_refused_before_any_allocation(tmp_path: Path, holder, nbytes: int) -> None:  # type: ignore[no-untyped-def]
    shelf, server = holder
    msg, nonce = replica_net._request(replica_net.PUT, 0, 0, 5, nbytes, KEY)
    with socket.create_connection(server.address) as sock:
        sock.sendall(msg + b"\0" * 4096)
        with pytest.raises(replica_net.ReplicaError, match=r"budget|shorter than its header"):
            replica_net._check_reply(sock, KEY, nonce)
    assert list(shelf.dir.iterdir()) == []  # no slot, no temp file, no sparse file
    assert shelf.held() == [] and shelf.find(0, 5) is None


def test_a_stalled_put_blocks_nobody_and_a_failed_one_leaves_nothing(tmp_path: Path, holder) -> None:  # type: ignore[no-untyped-def]
    shelf, server = holder
    store, path, nbytes = _owner_file(tmp_path, 0, 5)
    replica_net.put(server.address, 0, 5, path, nbytes, key=KEY)
    pulled = ReplicaShelf(tmp_path / "pulled", world_size=4, fingerprint="run")

    # the owner's 50 KB then silence: the server waits on it without any lock
    msg, _ = replica_net._request(replica_net.PUT, 0, 0, 6, nbytes, KEY)
    stalled = socket.create_connection(server.address)
    stalled.sendall(msg + path.read_bytes()[: 50 * 1024])
    time.sleep(0.3)
    assert [p.name.startswith(".incoming-rank0") for p in shelf.dir.iterdir()].count(True) == 1
    t0 = time.monotonic()
    assert [(h.owner, h.step) for h in shelf.held()] == [(0, 5)]  # the restore agreement's view
    assert shelf.find(0, 5) is not None
    replica_net.get(server.address, 0, 5, pulled, key=KEY)  # a GET is served meanwhile
    assert time.monotonic() - t0 < 2.0

    # the owner's next PUT supersedes the stalled one: it lands, the stalled one's temp file is gone
    store.write(7, build_save_dict({"model": torch.nn.Linear(32, 32)}, 0))
    store.wait()
    (offer,) = [o for o in store.offers()[0] if o.header.step == 7]
    replica_net.put(server.address, 0, 7, store.path(offer.slot), nbytes, key=KEY)
    assert [(h.owner, h.step) for h in shelf.held()] == [(0, 7), (0, 5)]
    stalled.close()
    deadline = time.monotonic() + 5
    while _leftovers(shelf) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _leftovers(shelf) == []

    # a PUT cut off mid-payload: refused, no file left, the newest replica held stays. (The older one,
    # step 5, may be gone: a transfer that reaches the shelf frees the slot it will replace first, so a
    # holder never needs room for three replicas of one owner; whether this one got that far depends on
    # when the server reads the header of a connection that closes.)
    msg, _ = replica_net._request(replica_net.PUT, 0, 0, 8, nbytes, KEY)
    with socket.create_connection(server.address) as sock:
        sock.sendall(msg + path.read_bytes()[: nbytes // 2])
    deadline = time.monotonic() + 5
    while _leftovers(shelf) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _leftovers(shelf) == []
    held = [(h.owner, h.step) for h in shelf.held()]
    assert held[0] == (0, 7) and (0, 8) not in held and set(held) <= {(0, 7), (0, 5)}
    store.close()


def test_connections_past_the_cap_are_closed_and_slow_headers_time_out(
    tmp_path: Path, holder, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    _, server = holder
    monkeypatch.setattr(replica_net, "HEADER_TIMEOUT_S", 1.0)
    store, path, nbytes = _owner_file(tmp_path, 0, 5)
    idle = [socket.create_connection(server.address) for _ in range(replica_net.MAX_CONNECTIONS + 4)]
    # each idle connection's header deadline (1 s) and its refusal's linger pass: their slots free again
    time.sleep(1.0 + replica_net.LINGER_S + 1.0)
    done = threading.Event()

    def put() -> None:
        replica_net.put(server.address, 0, 5, path, nbytes, key=KEY)
        done.set()

    threading.Thread(target=put, daemon=True).start()
    assert done.wait(5.0), "a valid PUT waited behind idle strangers"
    assert server.refused >= replica_net.MAX_CONNECTIONS
    for sock in idle:
        sock.close()
    store.close()


def test_an_older_put_reaching_the_server_second_never_cuts_off_the_newer(holder) -> None:  # type: ignore[no-untyped-def]
    """Newer is by the owner's send time, not by which handler thread got there first: under load an older
    PUT's thread arrived second and shut the newer one's connection before its reply went out."""
    _, server = holder
    newer, newer_peer = socket.socketpair()
    older, older_peer = socket.socketpair()
    with newer, newer_peer, older, older_peer:
        server._supersede(0, newer, sent_ns=2_000)
        with pytest.raises(replica_net.ReplicaError, match="a newer replica put of rank 0 is in flight"):
            server._supersede(0, older, sent_ns=1_000)
        newer_peer.sendall(b"x")
        assert newer.recv(1) == b"x", "the newer PUT's connection was cut off"
        latest, latest_peer = socket.socketpair()
        with latest, latest_peer:
            server._supersede(0, latest, sent_ns=3_000)  # a newer one still cuts it off
            assert newer.recv(1) == b""
