"""The final state digest hashes each rank's shards where they lie (trainer/digest/state_digest_sharded.py)
and must equal the digest of the same state unsharded, whatever the sharding: rows split unevenly, columns
split, replicated copies, a rank holding nothing. It must also see every bit and every position."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.trainer._dist import run_ranks
from trainer.digest import state_digest_sharded
from trainer.digest.state_digest_sharded import sharded_digests


def _state() -> dict[str, Any]:
    gen = torch.Generator().manual_seed(7)
    return {
        "w": torch.randn(5, 3, generator=gen),  # 5 rows over 2 or 3 ranks: uneven shards
        "e": torch.randn(4, 6, generator=gen),  # split by columns below
        "r": torch.randn(2, 2, generator=gen),  # replicated
        "h": torch.randn(3, generator=gen).to(torch.bfloat16),  # 2-byte elements
        "i": torch.arange(7, dtype=torch.int64),
        "tiny": torch.randn(1, 4, generator=gen),  # one row: the other ranks hold nothing
        "step": torch.tensor(12.0),  # a plain tensor (as the optimizer's step): rank 0's counts
        "lr": 0.001,
    }


def _unsharded() -> bytes:
    digests = sharded_digests({"part": _state()})
    assert digests is not None
    return digests["part"]


def _sharded(rank: int, world_size: int, out: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (world_size,))
    state = _state()
    placed = {
        "w": [Shard(0)],
        "e": [Shard(1)],
        "r": [Replicate()],
        "h": [Shard(0)],
        "i": [Shard(0)],
        "tiny": [Shard(0)],
    }
    for key, placements in placed.items():
        state[key] = distribute_tensor(state[key], mesh, placements)
    digests = sharded_digests({"part": state})
    if rank == 0:
        assert digests is not None
        Path(out).write_bytes(digests["part"])
    else:
        assert digests is None


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 3])
def test_the_digest_of_a_sharded_state_is_the_unsharded_one(tmp_path: Path, world_size: int) -> None:
    out = tmp_path / "digest"
    run_ranks(_sharded, world_size, str(out))
    assert out.read_bytes() == _unsharded()


def test_the_digest_sees_every_bit_every_position_and_every_key() -> None:
    base = _unsharded()

    def digest_of(change: Any) -> bytes:
        state = _state()
        change(state)
        digests = sharded_digests({"part": state})
        assert digests is not None
        return digests["part"]

    def flip_lowest_bit(state: dict[str, Any]) -> None:
        state["w"].view(torch.int32)[2, 1] ^= 1

    def swap_two(state: dict[str, Any]) -> None:
        state["i"][[1, 2]] = state["i"][[2, 1]]

    def rename(state: dict[str, Any]) -> None:
        state["w2"] = state.pop("w")

    def reshape(state: dict[str, Any]) -> None:
        state["e"] = state["e"].reshape(6, 4)

    def plain_value(state: dict[str, Any]) -> None:
        state["lr"] = 0.002

    changed = [digest_of(c) for c in (flip_lowest_bit, swap_two, rename, reshape, plain_value)]
    assert base not in changed
    assert len(set(changed)) == len(changed)
    assert digest_of(lambda state: None) == base  # deterministic


def test_large_tensors_are_hashed_in_slices_to_the_same_value(monkeypatch: pytest.MonkeyPatch) -> None:
    """Slicing (CHUNK) bounds the temporaries for any model size; it must not change the value."""
    whole = _unsharded()
    monkeypatch.setattr(state_digest_sharded, "CHUNK", 5)
    assert _unsharded() == whole
