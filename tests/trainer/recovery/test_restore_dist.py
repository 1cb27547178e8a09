"""Restore agreement across 2 gloo ranks with FSDP2 shards (trainer/recovery/restore.py).

Every rank must resume at the same step: the newest step every rank can restore from memory, else the
durable checkpoint. A rank whose newest snapshot is damaged pulls the whole group back to the step
before; a rank with no snapshot at all sends the group to the durable checkpoint. The damaged slot is
one an earlier worker left in /dev/shm (a worker restart: its payload is checked by the load); a slot the
restoring process committed itself is its own memory and is not checked again (store.offers).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh

from tests.trainer._ckpt import Events
from tests.trainer._dist import run_ranks
from trainer.checkpoint import CheckpointConfig, CheckpointLoop, CheckpointManager
from trainer.recovery.restore import restore
from trainer.reference.model import ModelConfig, build_model
from trainer.snapshot.store import HEADER_BYTES, SnapshotStore
from trainer.state.save_dict import build_save_dict

pytestmark = pytest.mark.slow

SMALL = ModelConfig(dim=32, n_layers=2, n_heads=4, n_kv_heads=2, vocab_size=64, ffn_hidden=48, max_seq_len=16)


class Step:
    def __init__(self) -> None:
        self.step = -1

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step}

    def load_state_dict(self, sd: dict[str, Any]) -> None:
        self.step = int(sd["step"])


def _state(mesh: Any, seed: int) -> dict[str, Any]:
    model = build_model(SMALL, mesh=mesh, device=torch.device("cpu"), seed=seed)
    return {"model": model, "optim": torch.optim.AdamW(model.parameters(), lr=1e-2), "trainer": Step()}


def _train(state: dict[str, Any], step: int) -> None:
    gen = torch.Generator().manual_seed(step)
    tokens = torch.randint(0, SMALL.vocab_size, (2, 9), generator=gen)
    logits = state["model"](tokens[:, :-1])
    F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()).backward()
    state["optim"].step()
    state["optim"].zero_grad(set_to_none=True)
    state["trainer"].step = step


def _locals(state: dict[str, Any]) -> list[torch.Tensor]:
    return [p.to_local().clone() for p in state["model"].parameters()]


def _agree_all(rank: int, world_size: int, root: str) -> None:
    # one set of processes for the three cases: spawning ranks costs more than the cases themselves
    mesh = init_device_mesh("cpu", (world_size,))
    for damage in ("none", "newest", "all"):
        _agree(rank, world_size, mesh, Path(root) / damage, damage)


def _agree(rank: int, world_size: int, mesh: Any, root: Path, damage: str) -> None:
    state = _state(mesh, seed=0)
    store = SnapshotStore(root / "shm", rank=rank, world_size=world_size, fingerprint="f")
    refs = []
    for step in range(2):
        _train(state, step)
        store.write(step, build_save_dict(state, rank))
        refs.append(_locals(state))
    store.wait()
    if rank == 1 and damage == "newest":
        with open(store.path(1), "r+b") as fh:  # step 1 went to slot 1
            fh.seek(HEADER_BYTES + 8)
            fh.write(b"\xff\xff\xff\xff")
        store.close()  # rank 1 restarts as a new worker: the slots are an earlier process's
        store = SnapshotStore(root / "shm", rank=rank, world_size=world_size, fingerprint="f")
    if rank == 1 and damage == "all":
        store.remove()
        store = SnapshotStore(root / "shm", rank=rank, world_size=world_size, fingerprint="f")
    cfg = CheckpointConfig(dir=root / "ckpt", mode="sync")
    ckpt = CheckpointLoop(
        CheckpointManager(cfg, rank=rank, world_size=world_size), cfg, Events(), rank=rank, last_step=1
    )
    fresh = _state(mesh, seed=7)
    try:
        got = restore(store, ckpt, fresh, rank=rank, device=torch.device("cpu"), events=ckpt.events)
    finally:
        ckpt.close()
    sources = [e["source"] for e in ckpt.events.seen if e["ev"] == "restore"]
    assert sources == [got.source], sources  # one restore event, from whichever side restored
    expected = {"none": (1, "memory"), "newest": (0, "shm" if rank == 1 else "memory"), "all": (-1, "none")}[
        damage
    ]
    assert (got.step, got.source) == expected, (rank, got)
    if got.step >= 0:
        assert fresh["trainer"].step == got.step
        assert all(torch.equal(a, b) for a, b in zip(_locals(fresh), refs[got.step], strict=True))
        # training on from the restored state matches training on from the original
        _train(fresh, got.step + 1)
    else:
        assert not fresh["optim"].state, "a fresh start must not keep optimizer state from a template"
    if damage == "newest" and rank == 1:
        assert any("checksum" in r for r in got.refused), got.refused
    store.close()


def test_every_rank_restores_the_newest_step_all_ranks_have(tmp_path: Path) -> None:
    """Cases: nothing damaged (step 1 from memory); rank 1's newest snapshot fails its checksum (both
    ranks step 0); rank 1 has no snapshot (both ranks the durable checkpoint: none here, fresh start)."""
    run_ranks(_agree_all, 2, str(tmp_path), timeout_s=240)
