"""A stranger on the host of a live run is refused by its replica servers, and the run ends exactly as
without it: 2 "nodes" x 1 gloo rank with the real Snapshots manager (replicated every step). While the
ranks train, a separate process (tests/trainer/snapshot/_stranger.py) that knows both servers' addresses
but not the job's key tries GETs, PUTs under a guessed key, a 2^62-byte PUT, a negative owner, garbage
and holds idle connections. Every attempt is refused; every replica of the run lands; nothing but
verified slots is left in the replica directories; then, with the stranger's connections still open,
node 1 is replaced and restores from its peer (agreement and GET unaffected) and the final state has
the fault-free run's sha256.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.distributed.device_mesh import init_device_mesh

from tests.trainer._ckpt import Events, make_state, snapshot, train_step
from tests.trainer._dist import run_ranks
from trainer.checkpoint import CheckpointConfig, CheckpointLoop, CheckpointManager
from trainer.recovery.restore import restore_attempt
from trainer.snapshot.config import SnapshotConfig
from trainer.snapshot.manager import Snapshots

pytestmark = pytest.mark.slow

STEPS, LOST_AFTER = 6, 3


def _digest(state: dict[str, Any]) -> str:
    h = hashlib.sha256()
    for key, value in sorted(snapshot(state).items()):
        h.update(key.encode())
        h.update(value.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _process(root: Path, rank: int) -> tuple[Snapshots, CheckpointLoop, Events]:
    events = Events()
    cfg = CheckpointConfig(dir=root / "ckpt", mode="sync", interval_steps=100)
    ckpt = CheckpointLoop(CheckpointManager(cfg, rank=rank, world_size=2), cfg, events, rank=rank,
                          last_step=STEPS - 1)  # fmt: skip
    snaps = Snapshots(SnapshotConfig(interval_steps=1, dir=root / f"node{rank}"), rank=rank, world_size=2,
                      fingerprint="run")  # fmt: skip
    return snaps, ckpt, events


def _stranger(snaps: Snapshots, hold_s: float) -> subprocess.Popen[str]:
    assert snaps.peers is not None
    addresses = ",".join(f"{h}:{p}" for h, p in snaps.peers._addresses.values())
    env = {**os.environ, "PYTHONPATH": os.getcwd()}
    return subprocess.Popen(
        [sys.executable, "-m", "tests.trainer.snapshot._stranger", addresses, "3", str(hold_s)],
        stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip


def _run(rank: int, world_size: int, root_str: str) -> None:
    import torch.distributed as dist

    os.environ["LOCAL_WORLD_SIZE"] = "1"
    root = Path(root_str)
    mesh = init_device_mesh("cpu", (world_size,))
    reference = make_state(mesh, seed=0)
    for step in range(STEPS):
        train_step(reference, step)
    expected = _digest(reference)

    snaps, ckpt, events = _process(root, rank)
    state = make_state(mesh, seed=0)
    assert restore_attempt(snaps, ckpt, state, torch.device("cpu"), events).step == -1  # keys the channel
    stranger = _stranger(snaps, hold_s=20.0) if rank == 0 else None
    if stranger is not None:
        assert stranger.stdout is not None
        report = json.loads(stranger.stdout.readline())  # every attempt made before training goes on
        assert report["answers"] and set(report["answers"]) <= {"refused", "closed"}, report
    dist.barrier()
    for step in range(LOST_AFTER + 1):
        train_step(state, step)
        snaps.after_step(step, state)
    assert snaps.peers is not None and snaps.peers.flush(timeout_s=60)
    sent = [e for e in events.seen if e["ev"] == "replica"]
    assert [e["step"] for e in sent if e["ok"]][-1] == LOST_AFTER and all(e["ok"] for e in sent), sent
    dist.barrier()
    if rank == 1:
        assert snaps.peers.server.refused > 0, "the stranger reached rank 1's server too"
    else:
        assert snaps.peers.server.refused > 0
    replicas = root / f"node{rank}" / "replicas"
    assert sorted(p.name for p in replicas.iterdir()) == [f"rank{1 - rank}.slot0", f"rank{1 - rank}.slot1"]
    ckpt.close()
    snaps.close()

    if rank == 1:  # node 1 is replaced: an empty /dev/shm, it restores from rank 0's replica
        shutil.rmtree(root / "node1")
    dist.barrier()
    snaps, ckpt, events = _process(root, rank)
    state = make_state(mesh, seed=7)
    restored = restore_attempt(snaps, ckpt, state, torch.device("cpu"), events)
    assert (restored.step, restored.source) == (LOST_AFTER, ("shm", "peer")[rank])
    for step in range(LOST_AFTER + 1, STEPS):
        train_step(state, step)
        snaps.after_step(step, state)
    assert _digest(state) == expected, f"rank {rank}: the stranger changed the run"
    ckpt.close()
    snaps.finish()
    if stranger is not None:
        stranger.kill()
        stranger.wait()


def test_a_stranger_on_the_host_is_refused_and_the_run_ends_exact(tmp_path: Path) -> None:
    run_ranks(_run, 2, str(tmp_path), timeout_s=120)
