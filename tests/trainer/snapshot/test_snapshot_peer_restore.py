"""A replaced node restores from its peer's replica: 2 "nodes" x 1 gloo rank (trainer/snapshot/replica.py).

Each rank runs the real Snapshots manager (snapshots every step, replicated over TCP to the other node)
and a sync durable checkpoint every 3 steps, trains steps 0-3, and then every process "dies" (its objects
are closed, nothing removed). Node 1 is replaced: its snapshot directory (the pod's /dev/shm) is wiped,
as tools/localjob.py PodSpec.fresh_dirs does for a replaced pod. New objects (new servers, fresh model
weights) restore and train on to step 5; the full model + optimizer state must have the same sha256 as
a fault-free run's. Cases:
- peer:      both restore step 3; rank 0 from its /dev/shm (`shm`), rank 1 from rank 0's replica (`peer`).
- transit:   rank 1's pull of step 3 arrives damaged (a byte flipped on the wire): it fails its checksum,
             the group agrees again and both restore step 2 (rank 1 from the peer again).
- corrupt:   both replicas rank 0 keeps for rank 1 are damaged in memory: no longer offered (rank 0
             reports each once), so both ranks restore the durable checkpoint of step 2 (`fsx`).
- shm-corrupt: no node is lost, but rank 1's newest snapshot in its own /dev/shm is damaged at rest (the
             `snapshot-corrupt` fault's own damage): rank 1 skips it (`restore_skipped`, quarantined) and
             takes the same step from the next source, rank 0's replica: both restore step 3, exact.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.distributed.device_mesh import init_device_mesh

from tests.trainer._ckpt import Events, make_state, snapshot, train_step
from tests.trainer._dist import run_ranks
from trainer.checkpoint import CheckpointConfig, CheckpointLoop, CheckpointManager
from trainer.recovery.restore import restore_attempt
from trainer.snapshot import replica_net
from trainer.snapshot.config import SnapshotConfig
from trainer.snapshot.manager import Snapshots
from trainer.snapshot.store import HEADER_BYTES, SnapshotStore

pytestmark = pytest.mark.slow

STEPS = 6
LOST_AFTER = 3  # the last step done before the node is lost
CASES = ("peer", "transit", "corrupt", "shm-corrupt")
EXPECTED = {  # case -> (step restored, source on rank 0, source on rank 1)
    "peer": (3, "shm", "peer"),
    "transit": (2, "shm", "peer"),
    "corrupt": (2, "fsx", "fsx"),
    "shm-corrupt": (3, "shm", "peer"),
}
SKIPPED = {  # case -> per rank, the (source, step) of each copy it skipped at the restore
    "peer": ([], []),
    "transit": ([], [("peer", 3)]),
    "corrupt": ([("peer", 2), ("peer", 3)], []),
    "shm-corrupt": ([], [("shm", 3)]),
}


def _digest(state: dict[str, Any]) -> str:
    """sha256 of the full (unsharded) model and optimizer state; a collective."""
    h = hashlib.sha256()
    for key, value in sorted(snapshot(state).items()):
        h.update(key.encode())
        h.update(value.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _ckpt(root: Path, rank: int, events: Events) -> CheckpointLoop:
    cfg = CheckpointConfig(dir=root / "ckpt", mode="sync", interval_steps=3)
    manager = CheckpointManager(cfg, rank=rank, world_size=2)
    return CheckpointLoop(manager, cfg, events, rank=rank, last_step=STEPS - 1)


def _process(root: Path, rank: int) -> tuple[Snapshots, CheckpointLoop, Events]:
    """What one worker process builds: its snapshot manager (server included) and checkpoint loop."""
    cfg = SnapshotConfig(interval_steps=1, dir=root / f"node{rank}")
    events = Events()
    return Snapshots(cfg, rank=rank, world_size=2, fingerprint="run"), _ckpt(root, rank, events), events


def _train(state: dict[str, Any], steps: range, snaps: Snapshots, ckpt: CheckpointLoop) -> None:
    for step in steps:
        train_step(state, step)
        snaps.after_step(step, state)
        ckpt.after_step(step, state)


def _all_cases(rank: int, world_size: int, root: str) -> None:
    os.environ["LOCAL_WORLD_SIZE"] = "1"  # one rank per "node": the ring is rank 0 <-> rank 1
    mesh = init_device_mesh("cpu", (world_size,))
    reference = make_state(mesh, seed=0)
    for step in range(STEPS):
        train_step(reference, step)
    expected_digest = _digest(reference)
    for case in CASES:
        _case(rank, mesh, Path(root) / case, case, expected_digest)


def _case(rank: int, mesh: Any, root: Path, case: str, expected_digest: str) -> None:
    import torch.distributed as dist

    snaps, ckpt, events = _process(root, rank)
    state = make_state(mesh, seed=0)
    assert restore_attempt(snaps, ckpt, state, torch.device("cpu"), events).step == -1
    assert snaps.peers is not None, "two nodes: replication is on"
    _train(state, range(LOST_AFTER + 1), snaps, ckpt)
    assert snaps.peers.flush(timeout_s=60), "the last snapshot was not replicated"
    sent = [e for e in events.seen if e["ev"] == "replica"]
    assert sent and all(e["ok"] and e["bytes"] > 0 and e["holder"] == 1 - rank for e in sent), sent
    assert sent[-1]["step"] == LOST_AFTER
    dist.barrier()  # every replica has landed (each holder still serving) before anything is closed
    ckpt.close()
    snaps.close()

    # -- the node is lost: every worker process ends; node 1 comes back with an empty /dev/shm
    if rank == 1 and case != "shm-corrupt":
        shutil.rmtree(root / "node1")
    if rank == 1 and case == "shm-corrupt":  # only the worker process ends; its snapshot is damaged
        damaged = SnapshotStore(root / "node1", rank=1, world_size=2, fingerprint="run")
        assert damaged.damage_newest() is not None
        damaged.close()
    if rank == 0 and case == "corrupt":
        for path in sorted((root / "node0" / "replicas").glob("rank1.slot*")):
            with open(path, "r+b") as fh:
                fh.seek(HEADER_BYTES + 64)
                fh.write(b"\xde\xad\xbe\xef")
    if rank == 1 and case == "transit":
        _flip_one_byte_of_the_first_pull()
    dist.barrier()

    snaps, ckpt, events = _process(root, rank)
    state = make_state(mesh, seed=7)  # other weights: the restore must overwrite every value
    restored = restore_attempt(snaps, ckpt, state, torch.device("cpu"), events)
    step, *sources = EXPECTED[case]
    assert (restored.step, restored.source) == (step, sources[rank]), (rank, case, restored)
    restores = [e for e in events.seen if e["ev"] == "restore"]
    assert [(e["step"], e["source"]) for e in restores] == [(step, sources[rank])], restores
    if case == "transit" and rank == 1:
        assert any("checksum" in r for r in restored.refused), restored
    skipped = [e for e in events.seen if e["ev"] == "restore_skipped"]
    assert sorted((e["source"], e["step"]) for e in skipped) == SKIPPED[case][rank], (rank, case, skipped)
    assert all("checksum" in e["reason"] for e in skipped), skipped
    _train(state, range(step + 1, STEPS), snaps, ckpt)
    digest = _digest(state)
    assert digest == expected_digest, f"rank {rank}, case {case}: state differs from the fault-free run"
    ckpt.close()
    snaps.finish()
    dist.barrier()
    assert not any((root / f"node{rank}").rglob("rank*.slot*")), "a completed run leaves snapshots behind"


def _flip_one_byte_of_the_first_pull() -> None:
    """Damage the next replica payload this process receives (a fault on the wire, after the sender's
    checksum was computed)."""
    original = replica_net._recv_into
    flipped = []

    def recv_into(sock: Any, view: memoryview) -> None:
        original(sock, view)
        if not flipped and len(view) > HEADER_BYTES:
            view[len(view) // 2] ^= 0xFF
            flipped.append(True)

    replica_net._recv_into = recv_into  # type: ignore[assignment]


def test_a_replaced_node_restores_from_its_peer_and_ends_exact(tmp_path: Path) -> None:
    run_ranks(_all_cases, 2, str(tmp_path), timeout_s=300)
