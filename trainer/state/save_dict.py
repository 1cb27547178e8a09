"""What goes into a checkpoint, and back: the loop's state objects <-> a flat DCP state dict.

The loop passes {"model": nn.Module, "optim": Optimizer | None, <name>: Stateful, ...}.

- Model and optimizer go through torch.distributed.checkpoint.state_dict.get_/set_state_dict: for FSDP2
  these are DTensor shards, saved in DCP's reshardable format (a 2-rank checkpoint loads on 1 rank).
- Every other entry (the trainer's step, data cursor, RNG states, a scheduler, a team's state) is *per
  rank*: DCP would deduplicate identical keys across ranks and keep one rank's copy, so each rank saves
  it under "<name>@rank<R>", as one opaque value (trainer/state/entry_blob.py): it comes back as
  saved whatever its structure, where a template built from the fresh object would lose keys it gained.
  At load, a rank whose own entry is missing (the world grew) takes rank 0's; the data cursor is built to
  continue at the same global sample position in that case.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import get_state_dict, set_optimizer_state_dict, set_state_dict
from torch.distributed.tensor import DTensor

from trainer.state import entry_blob

MODEL, OPTIM = "model", "optim"


def per_rank_key(name: str, rank: int) -> str:
    return f"{name}@rank{rank}"


def build_save_dict(state: dict[str, Any], rank: int) -> dict[str, Any]:
    """The flat dict handed to DCP for saving (references to live tensors, no copies)."""
    model = state.get(MODEL)
    if not isinstance(model, nn.Module):
        raise TypeError("state['model'] must be the nn.Module to checkpoint")
    optim = state.get(OPTIM)
    out: dict[str, Any] = {}
    if optim is not None:
        create_optimizer_state(optim)
        out[MODEL], out[OPTIM] = get_state_dict(model, optim)
    else:
        out[MODEL], _ = get_state_dict(model, [])
    out.update(per_rank_entries(state, rank))
    return out


def per_rank_entries(state: dict[str, Any], rank: int) -> dict[str, bytes]:
    """The save dict's per-rank entries ("<name>@rank<R>": the encoded state of each non-model entry)."""
    return {
        per_rank_key(name, rank): entry_blob.encode(obj.state_dict())
        for name, obj in state.items()
        if name not in (MODEL, OPTIM) and obj is not None
    }


def create_optimizer_state(optim: torch.optim.Optimizer) -> None:
    """Give a fresh Adam/AdamW its per-parameter state (zero moments, step 0), as its first step would.

    A state dict needs the state to exist. Without it, DCP's get_state_dict creates it by running one
    optimizer step with zero gradients and lr 0: the whole AdamW update (sqrt, lerp, addcdiv, ...) through
    DTensor dispatch, which in a freshly started worker is most of a restore's time. The
    optimizer's own `_init_group` creates exactly the tensors that step would (same keys, dtypes,
    shapes and placements), without computing anything; every value is then overwritten by the restore.
    Other optimizers, and one that has state already, are left to DCP.
    """
    init_group = getattr(optim, "_init_group", None)
    if optim.state or not isinstance(optim, torch.optim.Adam) or init_group is None:
        return
    for group in optim.param_groups:
        params = [p for p in group["params"] if p.requires_grad and p.grad is None]
        for p in params:
            p.grad = p.detach()  # read only for its layout (sparse or not); never written
        try:
            init_group(group, [], [], [], [], [], [])
        finally:
            for p in params:
                p.grad = None


def build_load_dict(state: dict[str, Any], rank: int, saved_keys: set[str]) -> dict[str, Any]:
    """A template for dcp.load: same structure as build_save_dict, per-rank entries mapped to what exists.

    `saved_keys` are the flattened keys present in the checkpoint's metadata.
    """
    template = build_save_dict(state, rank)
    for name, obj in state.items():
        if name in (MODEL, OPTIM) or obj is None:
            continue
        own = per_rank_key(name, rank)
        source = own if _has_prefix(saved_keys, own) else per_rank_key(name, 0)
        if not _has_prefix(saved_keys, source):
            raise KeyError(f"checkpoint holds no state for {name!r} (looked for {own} and {source})")
        template[source] = template.pop(own)
    return template


def apply_loaded(state: dict[str, Any], loaded: dict[str, Any], rank: int) -> None:
    """Push a dict filled by dcp.load back into the live objects."""
    model, optim = state[MODEL], state.get(OPTIM)
    if optim is not None:
        set_state_dict(model, optim, model_state_dict=loaded[MODEL], optim_state_dict=loaded[OPTIM])
    else:
        set_state_dict(model, [], model_state_dict=loaded[MODEL], optim_state_dict={})
    _apply_entries(state, loaded, rank)


def apply_filled(state: dict[str, Any], loaded: dict[str, Any], rank: int) -> None:
    """apply_loaded for a build_save_dict template whose tensors were overwritten in place (a snapshot's
    load, codec.fill). The template's model tensors are the live model's own shards, so the values are
    there already, and the model's load_state_dict would copy every parameter onto itself through
    DTensor dispatch: in a freshly started worker the costliest part of a snapshot restore after the
    transfer. It is skipped when every model tensor of `loaded` is one of the live model's (checked,
    else apply_loaded); the optimizer (its hyperparameters and step counts) and every other entry are
    pushed back as apply_loaded does."""
    model, optim = state[MODEL], state.get(OPTIM)
    if not _is_models_own(model, loaded[MODEL]):
        apply_loaded(state, loaded, rank)
        return
    if optim is not None:
        set_optimizer_state_dict(model, optim, optim_state_dict=loaded[OPTIM])
    _apply_entries(state, loaded, rank)


def _is_models_own(model: nn.Module, values: dict[str, Any]) -> bool:
    """Every value is a tensor over the memory of one of the model's parameters or buffers."""
    own = {(t.data_ptr(), t.numel()) for t in map(_local, (*model.parameters(), *model.buffers()))}
    return all(
        isinstance(v, torch.Tensor)
        and (_local(v).numel() == 0 or (_local(v).data_ptr(), _local(v).numel()) in own)
        for v in values.values()
    )


def _apply_entries(state: dict[str, Any], loaded: dict[str, Any], rank: int) -> None:
    for name, obj in state.items():
        if name in (MODEL, OPTIM) or obj is None:
            continue
        own, first = per_rank_key(name, rank), per_rank_key(name, 0)
        obj.load_state_dict(entry_blob.decode(loaded[own] if own in loaded else loaded[first]))


def _has_prefix(keys: set[str], prefix: str) -> bool:
    return any(k == prefix or k.startswith(prefix + ".") for k in keys)


def tensor_bytes(obj: Any) -> int:
    """Bytes of this rank's tensor data in a (nested) state dict: local shards only for DTensors."""
    if isinstance(obj, DTensor):
        local = obj.to_local()
        return local.numel() * local.element_size()
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, list | tuple):
        return sum(tensor_bytes(v) for v in obj)
    return 0


class Stager:
    """Copies a state dict into CPU shared-memory buffers that are reused from save to save.

    This copy is the only part of an async save the loop waits for: afterwards the live tensors may
    change while a background worker writes the snapshot. Shared memory lets the NVRx worker process
    read the snapshot without another copy. Buffers are reused while the structure is unchanged (the
    manager never has two saves in flight, so the previous snapshot is written before the next copy).
    Uses torch's private _state_dict_utils helpers (the same ones dcp.async_save stages with); torch is
    pinned exactly, so they cannot drift underneath.
    """

    def __init__(self) -> None:
        self._buffers: dict[str, Any] | None = None
        self._signature: Any = None

    def stage(self, sd: dict[str, Any]) -> dict[str, Any]:
        from torch.distributed._state_dict_utils import _create_cpu_state_dict

        signature = _signature(sd)
        if self._buffers is None or signature != self._signature:
            self._buffers = _create_cpu_state_dict(sd, share_memory=True)
            self._signature = signature
        staged = copy_into(sd, self._buffers)
        if any(isinstance(t, torch.Tensor) and t.is_cuda for t in _leaves(sd)):
            torch.cuda.synchronize()
        return staged

    def release(self) -> None:
        self._buffers = None
        self._signature = None


def copy_into(src: Any, dst: Any) -> Any:
    """Copy src's tensors into dst's same-shaped tensors (DTensors shard to shard, no DTensor dispatch:
    a plain memcpy per tensor); returns dst's structure with src's non-tensor values."""
    if isinstance(src, DTensor):
        dst.to_local().copy_(src.to_local(), non_blocking=True)
        return dst
    if isinstance(src, torch.Tensor):
        dst.copy_(src, non_blocking=True)
        return dst
    if isinstance(src, dict):
        return {k: copy_into(v, dst[k]) for k, v in src.items()}
    if isinstance(src, list | tuple):
        return type(src)(copy_into(v, d) for v, d in zip(src, dst, strict=True))
    return src


def _leaves(obj: Any) -> list[Any]:
    if isinstance(obj, dict):
        return [leaf for v in obj.values() for leaf in _leaves(v)]
    if isinstance(obj, list | tuple):
        return [leaf for v in obj for leaf in _leaves(v)]
    return [obj]


def _signature(obj: Any) -> Any:
    """Structure, shapes and dtypes of a state dict (values of non-tensors excluded)."""
    if isinstance(obj, DTensor):
        local = obj.to_local()
        return ("D", tuple(local.shape), local.dtype, tuple(obj.shape))
    if isinstance(obj, torch.Tensor):
        return ("T", tuple(obj.shape), obj.dtype)
    if isinstance(obj, dict):
        return tuple((k, _signature(v)) for k, v in obj.items())
    if isinstance(obj, list | tuple):
        return tuple(_signature(v) for v in obj)
    return type(obj).__name__


def fingerprint(state: dict[str, Any]) -> str:
    """What makes a checkpoint this model's: parameter and buffer names, global shapes and dtypes, hashed.

    Global shapes (a DTensor's `.shape`), so the same model on another world size has the same
    fingerprint and a checkpoint still reshards; another preset or model change gives another one.
    """
    import hashlib

    model = state[MODEL]
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype};".encode())
    return digest.hexdigest()[:16]


class Rollback:
    """A copy of the live state, taken before any checkpoint is tried, put back after a failed load.

    dcp.load writes into the live (FSDP) tensors, and asking torch for an optimizer state dict fills an
    empty optimizer's state with a zero step (torch's _init_optim_state); a load that fails half-way
    would leave the next attempt, or a fresh start, with partly overwritten weights and a stepped
    optimizer. Put back, the state is bitwise what it was before (model shards, optimizer state, every
    Stateful and the torch RNG state through them). The copy lives in CPU memory and only while the loads
    are tried: at start-up, when the optimizer is usually still empty.
    """

    def __init__(self, state: dict[str, Any]) -> None:
        import copy

        self._state = state
        model = state[MODEL]
        self._tensors = {
            name: _local(t).detach().to("cpu", copy=True) for name, t in model.state_dict().items()
        }
        optim = state.get(OPTIM)
        self._optim = copy.deepcopy(optim.state_dict()) if optim is not None else None
        self._others = {
            name: copy.deepcopy(obj.state_dict())
            for name, obj in state.items()
            if name not in (MODEL, OPTIM) and obj is not None
        }
        self._rng = torch.get_rng_state()

    def restore(self) -> None:
        import copy

        model = self._state[MODEL]
        with torch.no_grad():
            for name, tensor in model.state_dict().items():
                _local(tensor).copy_(self._tensors[name])
        optim = self._state.get(OPTIM)
        if optim is not None and self._optim is not None:
            optim.load_state_dict(copy.deepcopy(self._optim))
            optim.zero_grad(set_to_none=True)
        for name, saved in self._others.items():
            self._state[name].load_state_dict(copy.deepcopy(saved))
        torch.set_rng_state(self._rng)


def _local(tensor: Any) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor
