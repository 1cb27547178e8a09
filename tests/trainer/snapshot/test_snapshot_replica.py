"""Peer replicas, one process: the ring mapping (trainer/snapshot/ring.py) and the replication channel
(replica_net.py + replica_shelf.py) between two shelves on real sockets: a replica lands whole and
verified, a damaged transfer or file is refused and the previous replica stays, GET returns it whole.
The multi-rank restore from a peer is tests/trainer/snapshot/test_snapshot_peer_restore.py.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import torch

from trainer.config.errors import UnrecoverableError
from trainer.snapshot import replica_net
from trainer.snapshot.budget import check_fits
from trainer.snapshot.replica_shelf import ReplicaShelf
from trainer.snapshot.ring import Ring
from trainer.snapshot.store import HEADER_BYTES, SnapshotStore
from trainer.state.save_dict import build_save_dict


def test_ring_keeps_each_rank_on_the_next_node_with_the_same_local_rank() -> None:
    ring = Ring(world_size=8, local_world_size=2)  # 4 nodes x 2
    assert ring.nnodes == 4 and ring.enabled
    assert [ring.holder(r) for r in range(8)] == [2, 3, 4, 5, 6, 7, 0, 1]
    assert [ring.owner(r) for r in range(8)] == [6, 7, 0, 1, 2, 3, 4, 5]
    for r in range(8):
        holder = ring.holder(r)
        assert holder is not None and ring.owner(holder) == r
        assert ring.node_of(holder) == (ring.node_of(r) + 1) % 4 and holder % 2 == r % 2
    # every rank keeps exactly one other rank's replica: the load is even
    assert sorted(ring.holder(r) for r in range(8)) == list(range(8))  # type: ignore[type-var]
    two = Ring(world_size=2, local_world_size=1)
    assert (two.holder(0), two.holder(1)) == (1, 0)


def test_ring_is_off_with_one_node_and_refuses_uneven_nodes() -> None:
    one = Ring(world_size=4, local_world_size=4)
    assert not one.enabled and one.holder(0) is None and one.owner(3) is None
    with pytest.raises(ValueError, match="not a multiple"):
        Ring(world_size=6, local_world_size=4)
    with pytest.raises(ValueError, match="outside"):
        Ring(world_size=4, local_world_size=2).holder(4)


def _owner_store(root: Path, step: int, seed: int) -> SnapshotStore:
    """Rank 1's snapshot of `step` in root/owner, committed."""
    torch.manual_seed(seed)
    model = torch.nn.Linear(64, 64)
    optim = torch.optim.AdamW(model.parameters())
    model(torch.randn(4, 64)).sum().backward()
    optim.step()
    store = SnapshotStore(root / "owner", rank=1, world_size=2, fingerprint="run")
    store.write(step, build_save_dict({"model": model, "optim": optim}, 1))
    store.wait()
    return store


def _file(store: SnapshotStore, step: int) -> tuple[Path, int]:
    (offer,) = [o for o in store.offers()[0] if o.header.step == step]
    path = store.path(offer.slot)
    return path, path.stat().st_size


KEY = b"k" * 32


def _put_raw(address: tuple[str, int], step: int, payload: bytes, nbytes: int) -> socket.socket:
    """An authenticated PUT of rank 1 whose payload bytes are `payload` (cut short or damaged)."""
    msg, _ = replica_net._request(replica_net.PUT, 1, 1, step, nbytes, KEY)
    mac = replica_net._mac(KEY, msg[: replica_net._REQUEST.size])
    mac.update(payload)
    sock = socket.create_connection(address)
    sock.sendall(msg + payload + (mac.digest() if len(payload) == nbytes else b""))
    return sock


def test_put_and_get_move_a_verified_replica_and_refuse_a_damaged_one(tmp_path: Path) -> None:
    holder = ReplicaShelf(tmp_path / "holder", world_size=2, fingerprint="run")
    server = replica_net.ReplicaServer(holder, "127.0.0.1", key=KEY)
    try:
        owner = _owner_store(tmp_path, step=3, seed=0)
        path, nbytes = _file(owner, 3)
        replica_net.put(server.address, 1, 3, path, nbytes, key=KEY)
        assert [(h.owner, h.step) for h in holder.held()] == [(1, 3)]
        assert holder.path(1, 0).read_bytes() == path.read_bytes()  # a byte-for-byte copy

        # a transfer cut short (the owner died mid-send) is refused; the replica of step 3 stays
        with _put_raw(server.address, 4, path.read_bytes()[: nbytes // 2], nbytes):
            pass
        owner.write(4, build_save_dict({"model": torch.nn.Linear(64, 64)}, 1))
        owner.wait()
        # a payload that does not match its header's checksum (flipped in transit) is refused too
        bad = bytearray(_file(owner, 4)[0].read_bytes())
        bad[HEADER_BYTES + 10] ^= 0xFF
        with (
            _put_raw(server.address, 4, bytes(bad), len(bad)) as sock,
            pytest.raises(replica_net.ReplicaError, match="checksum"),
        ):
            replica_net._check_reply(sock, KEY, b"")
        assert [(h.owner, h.step) for h in holder.held()] == [(1, 3)]
        path4, n4 = _file(owner, 4)
        replica_net.put(server.address, 1, 4, path4, n4, key=KEY)
        assert [(h.owner, h.step) for h in holder.held()] == [(1, 4), (1, 3)]

        # GET: a replaced node pulls its replica back, verified on arrival
        pulled = ReplicaShelf(tmp_path / "pulled", world_size=2, fingerprint="run")
        replica_net.get(server.address, 1, 3, pulled, key=KEY)
        reader = pulled.reader(1)
        assert [o.header.step for o in reader.offers()[0]] == [3]
        reader.close()
        with pytest.raises(replica_net.ReplicaError, match="no verified replica of rank 1 step 9"):
            replica_net.get(server.address, 1, 9, pulled, key=KEY)

        # a replica damaged in the holder's memory is no longer offered, and no longer served
        newest = holder.find(1, 4)
        assert newest is not None
        with open(newest.path, "r+b") as fh:
            fh.seek(HEADER_BYTES + 100)
            fh.write(b"\x00\x01\x02\x03")
        assert [(h.owner, h.step) for h in holder.held()] == [(1, 3)]
        with pytest.raises(replica_net.ReplicaError, match="no verified replica"):
            replica_net.get(server.address, 1, 4, pulled, key=KEY)
        owner.close()
    finally:
        server.close()


def test_budget_counts_own_and_peer_copies(tmp_path: Path) -> None:
    mib = 1 << 20
    assert check_fits(tmp_path, mib, local_ranks=2) == 2 * 2 * mib
    assert check_fits(tmp_path, mib, local_ranks=2, replicated=True) == 2 * (2 + 3) * mib
    import os

    st = os.statvfs(tmp_path)
    free = st.f_bavail * st.f_frsize
    # fits with own copies only, not with the peer copies as well: the error says so and what to do
    per_copy = free // 4
    check_fits(tmp_path, per_copy, local_ranks=1)
    with pytest.raises(UnrecoverableError, match=r"^snapshot_dir: .*2 own \+ 3 peer replica copies.*shmSize"):
        check_fits(tmp_path, per_copy, local_ranks=1, replicated=True)


def test_the_ranks_of_one_pod_leave_each_others_replicas_alone(tmp_path: Path) -> None:
    """Pod 0 of 2 nodes x 2 ranks: rank 0 keeps rank 2's replicas, rank 1 rank 3's, in one /dev/shm
    directory. A rank's cleanup after a restore must not delete what its local peer keeps or pulled (the
    demo once failed a survivor's restore with FileNotFoundError on the replica it was serving)."""
    from trainer.snapshot.replica import PULLED, REPLICAS, PeerReplicas

    pod = tmp_path / "pod0"
    state = build_save_dict({"model": torch.nn.Linear(8, 8)}, 1)

    def place(directory: Path, owner: int) -> None:  # a verified slot file of `owner`'s step 5
        store = SnapshotStore(directory, rank=owner, world_size=4, fingerprint="run")
        store.write(5, state)
        store.wait()
        store.close()

    for owner in (2, 3, 1):  # 1: kept by no rank of this node any more (the ring moved)
        place(pod / REPLICAS, owner)
    for puller in (0, 1):
        place(pod / PULLED, puller)
    ring = Ring(world_size=4, local_world_size=2)
    stores = [SnapshotStore(pod, rank=r, world_size=4, fingerprint="run") for r in (0, 1)]
    rank0, rank1 = (PeerReplicas(s, ring, host="127.0.0.1") for s in stores)
    try:
        assert {h.owner for h in rank0.shelf.held()} == {2, 1}  # its own, and the orphan (local rank 0)
        assert {h.owner for h in rank1.shelf.held()} == {3}
        rank0.after_restore(5)
        left = sorted(p.relative_to(pod).as_posix() for p in pod.glob("*/rank*.slot*"))
        assert left == ["pulled/rank1.slot0", "replicas/rank2.slot0", "replicas/rank3.slot0"], left
        rank1.after_restore(5)
        left = sorted(p.relative_to(pod).as_posix() for p in pod.glob("*/rank*.slot*"))
        assert left == ["replicas/rank2.slot0", "replicas/rank3.slot0"], left
    finally:
        for peers in (rank0, rank1):
            peers.close()
        for s in stores:
            s.close()
