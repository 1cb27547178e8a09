"""A checkpoint-style state dict <-> (a JSON skeleton, a list of local tensors), and back.

The snapshot keeps exactly what a durable checkpoint keeps (trainer/state/save_dict.py's save dict:
model and optimizer as FSDP2 DTensor shards, per-rank trainer state), but as raw bytes of each rank's
local shard: no resharding, no pickling. Non-tensor values (step counters, betas, the data cursor) go
into a JSON skeleton whose tags keep tuples tuples and dict keys of any JSON type, because the optimizer's
param_groups are compared bit for bit by the exactness test (a tuple of betas is not a list).
"""

from __future__ import annotations

import base64
import hashlib
import json
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.tensor import DTensor

ALIGN = 64
"""Every tensor starts on a 64-byte boundary (cache line; what pinned-memory DMA prefers)."""


@dataclass(frozen=True)
class TensorSlot:
    """Where one local tensor lives in the payload."""

    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int


def local_tensor(value: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor, or the tensor itself."""
    return value.to_local() if isinstance(value, DTensor) else value


def flatten(state: Any, values: list[torch.Tensor] | None = None) -> tuple[Any, list[torch.Tensor]]:
    """(skeleton, tensors): tensors replaced by {"x": index} in a JSON-encodable skeleton; `values`, when
    given, receives the tensor values themselves (DTensors as they are), in the same order."""
    tensors: list[torch.Tensor] = []

    def on_tensor(v: torch.Tensor) -> int:
        tensors.append(local_tensor(v))
        if values is not None:
            values.append(v)
        return len(tensors) - 1

    return _encode(state, on_tensor), tensors


def _encode(state: Any, on_tensor: Any) -> Any:
    def enc(v: Any) -> Any:
        if isinstance(v, torch.Tensor):
            return {"x": on_tensor(v)}
        if isinstance(v, dict):
            return {"d": [[enc(k), enc(x)] for k, x in v.items()]}
        if isinstance(v, tuple):
            return {"t": [enc(x) for x in v]}
        if isinstance(v, list):
            return {"l": [enc(x) for x in v]}
        if isinstance(v, bytes):  # an encoded per-rank entry (trainer/state/entry_blob.py)
            return {"b": base64.b64encode(v).decode("ascii")}
        if v is None or isinstance(v, bool | int | float | str):
            return v
        raise TypeError(f"snapshot cannot hold a {type(v).__name__} ({v!r:.80})")

    return enc(state)


def plan(tensors: list[torch.Tensor]) -> tuple[list[TensorSlot], int]:
    """Aligned offsets of `tensors` in a payload, and the bytes the tensors take (aligned)."""
    slots, offset = [], 0
    for t in tensors:
        nbytes = t.numel() * t.element_size()
        slots.append(TensorSlot(str(t.dtype).removeprefix("torch."), tuple(t.shape), offset, nbytes))
        offset += -(-nbytes // ALIGN) * ALIGN
    return slots, offset


class Stale(ValueError):
    """A save dict no longer matches the Plan it is encoded with (Snapshots then builds a new one)."""


@dataclass(frozen=True)
class Plan:
    """The tensors of one save dict and where each goes in a payload: what stays the same from snapshot
    to snapshot while the live objects keep their tensors (Snapshots keeps one per attempt)."""

    values: list[torch.Tensor]
    """The save dict's tensor values in flatten order (DTensors as they are), checked by identity."""
    tensors: list[torch.Tensor]
    """Their local tensors (what is copied)."""
    slots: list[TensorSlot]
    tensor_bytes: int
    sources: list[torch.Tensor]
    """The detached local tensors of the non-empty slots, in order: one copy call takes them all."""
    tensors_json: str
    """The slots as the payload's skeleton lists them (json.dumps of their fields)."""

    @classmethod
    def of(cls, values: list[torch.Tensor], tensors: list[torch.Tensor]) -> Plan:
        slots, tensor_bytes = plan(tensors)
        sources = [t.detach() for t, s in zip(tensors, slots, strict=True) if s.nbytes]
        return cls(values, tensors, slots, tensor_bytes, sources, json.dumps([s.__dict__ for s in slots]))


@dataclass(frozen=True)
class Flat:
    """A save dict as a snapshot writes it: its JSON skeleton (this snapshot's values) and its Plan."""

    skeleton: Any
    plan: Plan

    @property
    def tensors(self) -> list[torch.Tensor]:
        return self.plan.tensors

    @property
    def slots(self) -> list[TensorSlot]:
        return self.plan.slots

    @property
    def sources(self) -> list[torch.Tensor]:
        return self.plan.sources

    @property
    def tensor_bytes(self) -> int:
        return self.plan.tensor_bytes

    def payload_skeleton(self) -> bytes:
        """The payload's JSON after the tensors, byte for byte what
        json.dumps({"skeleton": ..., "tensors": ...}) writes."""
        return (
            '{"skeleton": ' + json.dumps(self.skeleton) + ', "tensors": ' + self.plan.tensors_json + "}"
        ).encode()

    def layout(self) -> str:
        return layout_id(self.skeleton, self.plan.slots)


def flat(state: Any) -> Flat:
    """`state` flattened and planned from scratch."""
    values: list[torch.Tensor] = []
    skeleton, tensors = flatten(state, values)
    return Flat(skeleton, Plan.of(values, tensors))


def skeleton_with(state: Any, p: Plan) -> Any:
    """The skeleton of `state` whose tensors are `p`'s, the same objects in the same order (only the
    non-tensor values differ from the state `p` was made of); raises Stale otherwise."""
    count = 0

    def on_tensor(v: torch.Tensor) -> int:
        nonlocal count
        if count >= len(p.values) or p.values[count] is not v:
            raise Stale(f"tensor {count} of the save dict is not the plan's")
        count += 1
        return count - 1

    skeleton = _encode(state, on_tensor)
    if count != len(p.values):
        raise Stale(f"the save dict has {count} tensors, the plan {len(p.values)}")
    return skeleton


def layout_id(skeleton: Any, slots: list[TensorSlot]) -> str:
    """Identifies the structure: keys, nesting, dtypes and local shapes (not the values).

    Two states with the same layout id can be copied into each other tensor by tensor.
    """
    shape_only = json.dumps(
        [_structure(skeleton), [(s.dtype, s.shape) for s in slots]], separators=(",", ":")
    )
    return hashlib.sha256(shape_only.encode()).hexdigest()[:16]


def _structure(node: Any) -> Any:
    """The skeleton with leaf values blanked, keys kept (a step counter's value is not layout)."""
    if isinstance(node, dict):
        if "d" in node:
            return {"d": [[k, _structure(v)] for k, v in node["d"]]}
        if "t" in node:
            return {"t": [_structure(v) for v in node["t"]]}
        if "l" in node:
            return {"l": [_structure(v) for v in node["l"]]}
        if "b" in node:  # bytes: their length and content are values, not layout
            return "bytes"
        return node  # {"x": i}
    return type(node).__name__


def decode(skeleton: Any, tensor_at: Any) -> Any:
    """Rebuild the state from a skeleton; `tensor_at(i)` supplies tensor i."""

    def dec(node: Any) -> Any:
        if isinstance(node, dict):
            if "x" in node:
                return tensor_at(int(node["x"]))
            if "d" in node:
                return {_hashable(dec(k)): dec(v) for k, v in node["d"]}
            if "t" in node:
                return tuple(dec(v) for v in node["t"])
            if "l" in node:
                return [dec(v) for v in node["l"]]
            if "b" in node:
                return base64.b64decode(node["b"], validate=True)
        return node

    return dec(skeleton)


def _hashable(key: Any) -> Any:
    return tuple(key) if isinstance(key, list) else key


def dtype_of(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r} in a snapshot")
    return dtype


def fill(template: Any, skeleton: Any, source: Any) -> Any:
    """The template's structure with every tensor overwritten in place from `source(i)` and every
    non-tensor value taken from the skeleton: what set_state_dict then pushes into the live objects.

    The template comes from the live objects (so its DTensors carry the right mesh and placements);
    a structural difference raises ValueError (the layout check should have caught it first).
    """

    def walk(t: Any, node: Any) -> Any:
        if isinstance(t, torch.Tensor):
            if not (isinstance(node, dict) and "x" in node):
                raise ValueError("snapshot has a value where the state has a tensor")
            local_tensor(t).copy_(source(int(node["x"])))
            return t
        if isinstance(t, dict):
            if not (isinstance(node, dict) and "d" in node):
                raise ValueError("snapshot structure differs from the state's")
            pairs = {_hashable(decode(k, None)): v for k, v in node["d"]}
            if set(pairs) != set(t):
                raise ValueError(f"snapshot keys differ: {sorted(map(str, set(pairs) ^ set(t)))[:5]}")
            return {k: walk(t[k], pairs[k]) for k in t}
        if isinstance(t, list | tuple) and isinstance(node, dict) and ("l" in node or "t" in node):
            items = node["l"] if "l" in node else node["t"]
            if len(items) != len(t):
                raise ValueError("snapshot list length differs from the state's")
            out = [walk(a, b) for a, b in zip(t, items, strict=True)]
            return tuple(out) if "t" in node else out
        return decode(node, None)  # a plain value: the snapshot's

    return walk(template, skeleton)
