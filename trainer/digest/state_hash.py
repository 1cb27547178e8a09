"""The exactness check's digest: a sha256 over the full (unsharded) model and optimizer state, and of every
rank's other checkpointed state (data position, RNG streams, scheduler, the team's entries).

Two runs that end with the same digest hold bit-identical weights, optimizer moments and loop state;
the tests compare a faulted run's digest with a fault-free one's (rank 0's `run_end` event carries it).
The model and optimizer are hashed where they lie, shard by shard (state_digest_sharded.py: no rank
gathers the state), and the value does not depend on the sharding.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

from trainer.digest.state_digest_sharded import sharded_digests


def state_digests(entries: Mapping[str, Any]) -> dict[str, Any] | None:
    """sha256 over the full (unsharded) model and optimizer state of `entries` and of every rank's other
    entries (the loop's step, data position and RNG streams, the scheduler, the team's state). On rank 0:
    {"all": the digest, "model": .., "optim": .., "<entry>": [one per rank], ...} (hex), so that a run
    that diverged says where; None on the other ranks. A collective."""
    model, optim = entries["model"], entries["optim"]
    device = next(model.parameters()).device
    full = sharded_digests(
        {"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, optim)}, device
    )
    # The per-rank entries differ between ranks: each rank hashes its own, rank 0 gathers all of them.
    states = {name: entries[name].state_dict() for name in sorted(entries) if name not in ("model", "optim")}
    own = bytearray()
    for value in states.values():
        part = hashlib.sha256()
        hash_into(part, value)
        own += part.digest()
    # Finer parts (e.g. trainer.rng.numpy), so that a run that diverged says where; not in the digest.
    fine = {f"{n}.{path}": v for n, state in states.items() for path, v in _leaves(state, depth=2)}
    for value in fine.values():
        part = hashlib.sha256()
        hash_into(part, value)
        own += part.digest()
    names = [*states, *fine]
    mine = torch.frombuffer(own, dtype=torch.uint8).to(device) if own else torch.zeros(0, dtype=torch.uint8)
    gathered = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, mine)
    if dist.get_rank() != 0:
        return None
    assert full is not None
    out: dict[str, Any] = {}
    digest = hashlib.sha256()
    for key, value in full.items():
        out[key] = value.hex()
        digest.update(f"<{key}>".encode() + value)
    rows = [bytes(t.cpu().numpy().tobytes()) for t in gathered]
    for i, name in enumerate(names):
        out[name] = [row[32 * i : 32 * (i + 1)].hex() for row in rows]
    for rank, row in enumerate(rows):
        digest.update(f"<rank{rank}>".encode() + row[: 32 * len(states)])
    out["all"] = digest.hexdigest()
    return out


def _leaves(value: Any, depth: int, prefix: str = "") -> list[tuple[str, Any]]:
    """(dotted key, value) for the dict entries of `value` down to `depth` levels."""
    if depth == 0 or not isinstance(value, dict) or not value:
        return [(prefix, value)] if prefix else []
    out: list[tuple[str, Any]] = []
    for key in sorted(value, key=str):
        out += _leaves(value[key], depth - 1, f"{prefix}.{key}" if prefix else str(key))
    return out


def hash_into(digest: Any, value: Any) -> None:
    if isinstance(value, dict):
        for key in sorted(value, key=str):
            digest.update(f"<{key}>".encode())
            hash_into(digest, value[key])
    elif isinstance(value, list | tuple):
        for item in value:
            hash_into(digest, item)
    elif isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        digest.update(f"{t.dtype}{tuple(t.shape)}".encode())
        # reshape(-1): 0-d tensors cannot be viewed as bytes
        digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    else:
        digest.update(repr(value).encode())
