"""The exactness check's digest: a sha256 of the full (unsharded) model and optimizer state, and of every
rank's other checkpointed state (data position, RNG streams, scheduler, the team's entries).

Two runs that end with the same digest hold bit-identical weights, optimizer moments and loop state;
the tests compare a faulted run's digest with a fault-free one's (rank 0's `run_end` event carries it).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
)


def state_sha256(
    model: torch.nn.Module, optim: torch.optim.Optimizer, entries: Mapping[str, Any] | None = None
) -> str | None:
    """sha256 of the full (unsharded) model and optimizer state and of every rank's other entries (the
    loop's step, data position and RNG streams, the scheduler, the team's state); a collective, the
    digest is on rank 0."""
    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    full = {
        "model": get_model_state_dict(model, options=opts),
        "optim": get_optimizer_state_dict(model, optim, options=opts),
    }
    # The per-rank entries differ between ranks: each rank hashes its own, rank 0 folds in all of them.
    mine = hashlib.sha256()
    for name in sorted(entries or {}):
        if name not in ("model", "optim"):
            mine.update(f"<{name}>".encode())
            hash_into(mine, entries[name].state_dict())  # type: ignore[index]
    own = torch.frombuffer(bytearray(mine.digest()), dtype=torch.uint8)
    device = next(model.parameters()).device
    gathered = [torch.empty_like(own, device=device) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, own.to(device))
    if dist.get_rank() != 0:
        return None
    digest = hashlib.sha256()
    hash_into(digest, full)
    for rank, part in enumerate(gathered):
        digest.update(f"<rank{rank}>".encode() + part.cpu().numpy().tobytes())
    return digest.hexdigest()


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
