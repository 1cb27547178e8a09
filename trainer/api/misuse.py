"""Misuse of the API, found before the first step: one line naming the rule broken and the fix.

Every check here runs when `job.loop` starts (after the team's build, before any step, so before a
restore or a save could go wrong quietly) or when the entry point is resolved (in the `check-config`
init container, before any GPU node is taken). A `Misuse` is an `UnrecoverableError`: no restart can fix
it, so the worker exits with the no-restart code and the Job fails with the line.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from trainer.config.errors import UnrecoverableError

RESERVED = ("model", "optim", "trainer", "scheduler")
"""Names of the library's own entries in a checkpoint; `state=` may not reuse them."""


class Misuse(UnrecoverableError):
    """The training function broke a rule of the API; `field` names what (model, data, state, ...)."""


def check_model(model: Any) -> None:
    """An nn.Module sharded with FSDP2: `fully_shard` on the root (and usually on each block)."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor

    if not isinstance(model, nn.Module):
        raise Misuse("model", f"must be a torch.nn.Module, got {type(model).__name__}")
    if not isinstance(model, FSDPModule):
        raise Misuse(
            "model",
            f"{type(model).__name__} is not sharded with FSDP2: call fully_shard(block, mesh=job.mesh) on "
            "its blocks and fully_shard(model, mesh=job.mesh) on the root before job.loop (FSDP1, DDP and "
            "unsharded models are not supported)",
        )
    plain = [name for name, p in model.named_parameters() if not isinstance(p, DTensor)]
    if plain:
        raise Misuse(
            "model",
            f"parameter {plain[0]} is not sharded ({len(plain)} in all): fully_shard every module that owns "
            "parameters, or the root after its children, before job.loop",
        )


def check_optimizer(optimizer: Any, model: nn.Module) -> None:
    """A torch Optimizer over exactly the model's (sharded) parameters."""
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise Misuse("optimizer", f"must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    own = {id(p) for p in model.parameters()}
    foreign = sum(1 for g in optimizer.param_groups for p in g["params"] if id(p) not in own)
    if foreign:
        raise Misuse(
            "optimizer",
            f"{foreign} of its parameters are not the model's: build the optimizer after fully_shard, from "
            "model.parameters() (fully_shard replaces each parameter with a sharded one)",
        )


def saveable(obj: Any) -> bool:
    return callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))


def check_data(data: Any, *, allow_unsaved: bool) -> tuple[Any, bool]:
    """(the data source the loop draws from, whether its position is saved).

    An object with state_dict/load_state_dict is used as it is; a DataLoader over a DistributedSampler
    is wrapped in a LoaderCursor (its position is the epoch and the batches drawn). A position that cannot
    be saved makes every resume repeat or skip data: refused unless the caller says
    `allow_unsaved_data=True` (then recorded in the run's events)."""
    from trainer.api.loader import LoaderCursor, resumable

    if not (hasattr(data, "__next__") or hasattr(data, "__iter__")):
        raise Misuse("data", f"must be an iterator or iterable of batches, got {type(data).__name__}")
    if saveable(data):
        return data, True
    if resumable(data):
        return LoaderCursor(data), True
    if allow_unsaved:
        return data, False
    raise Misuse(
        "data",
        f"{type(data).__name__} cannot save its position (no state_dict/load_state_dict, and not a "
        "DataLoader over a DistributedSampler), so a resume would repeat or skip data: use a "
        "DistributedSampler, wrap a map-style dataset in trainer.api.SampleCursor, or pass "
        "allow_unsaved_data=True to accept it (recorded in the run's events)",
    )


def check_state(scheduler: Any, state: Mapping[str, Any] | None) -> dict[str, Any]:
    """The extra checkpointed entries by name: the scheduler, then `state`'s, each saveable."""
    out: dict[str, Any] = {}
    if scheduler is not None:
        if not saveable(scheduler):
            raise Misuse("scheduler", f"{type(scheduler).__name__} has no state_dict/load_state_dict")
        out["scheduler"] = scheduler
    for name, obj in (state or {}).items():
        if not isinstance(name, str) or not name.isidentifier() or not name.isascii():
            raise Misuse("state", f"names must be ASCII identifiers, got {name!r:.60}")
        if name in RESERVED:
            raise Misuse("state", f"{name!r} is the library's own entry; pick another name")
        if not saveable(obj):
            raise Misuse(
                "state",
                f"{name}: {type(obj).__name__} has no state_dict/load_state_dict, so the library cannot "
                "checkpoint it: give it both methods (returning tensors, numbers, strings and "
                "lists/dicts of them)",
            )
        out[name] = obj
    return out


def check_encodable(entries: Mapping[str, Any]) -> None:
    """Every entry's state_dict holds only what a snapshot and a checkpoint keep exactly."""
    from trainer.state import codec

    for name, obj in entries.items():
        try:
            codec.flatten(obj.state_dict())
        except TypeError as exc:
            raise Misuse(
                "state",
                f"{name}: {exc}; a state_dict may hold tensors, numbers, strings, bools, None and "
                "lists/tuples/dicts of them",
            ) from None


def process_groups() -> set[int]:
    """Ids of the live process groups (torch keeps them in its world registry)."""
    from torch.distributed import distributed_c10d

    if not dist.is_initialized():
        return set()
    return {id(pg) for pg in distributed_c10d._world.pg_names}


def check_groups(known: Iterable[int]) -> None:
    """No process group made outside the library: it cannot tear such a group down in a restart, so the
    group's peers would stay blocked in a collective until its own timeout."""
    foreign = process_groups() - set(known)
    if foreign:
        raise Misuse(
            "process_group",
            f"{len(foreign)} process group(s) were created outside the library (dist.new_group or "
            "init_device_mesh): a restart cannot abort their collectives; use job.mesh, or "
            "job.device_mesh(shape, names) for more dimensions",
        )
