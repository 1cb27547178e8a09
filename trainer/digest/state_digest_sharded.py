"""A digest of a sharded tensor state that no rank gathers: each rank hashes the elements it holds, at
their global positions, and one all_reduce adds the ranks' parts.

Each element's hash depends on its bits, its global flat index and the tensor's key; a tensor's value is
the sum (mod 2**64, two lanes) of its elements' hashes. A sum does not care which rank added which
element, so the value is the same for every sharding of the same tensor (any world size, even shards or
not), and the same as a one-rank run's. Replicated copies count once (the rank at coordinate 0 of each
replicated mesh dimension adds them; a plain tensor, global rank 0).

What it replaces: gathering the full model and optimizer state on rank 0 and hashing it there, one
collective per tensor. That costs most of a second even for the tiny preset on CPU, at the end of every
run, and grows with the model: 70B parameters with their two Adam moments are 840 GB to gather to one host
and hash with one core (minutes), where this reads each rank's shard once.

The per-element hash is a multiply-xorshift finalizer over (bits xor a position key): not cryptographic. Two
states that differ by chance (non-determinism, a lost step) differ here but for a ~2**-128 chance; a
state built to collide with another is not what this check is for.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

LANES = 2
_LIMB_BITS = 32
_LIMBS = 64 // _LIMB_BITS
_LIMB_MASK = (1 << _LIMB_BITS) - 1
_WORD = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _signed(x: int) -> int:
    x &= (1 << 64) - 1
    return x - (1 << 64) if x >= 1 << 63 else x


_C1, _C2 = _signed(0xBF58476D1CE4E5B9), _signed(0x94D049BB133111EB)
_GOLDEN = _signed(0x9E3779B97F4A7C15)


def _shr(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Logical right shift of int64 values (torch's >> is arithmetic)."""
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def _mix(x: torch.Tensor) -> torch.Tensor:
    """Two multiply-xorshift rounds (MurmurHash3's 64-bit finalizer, less its first shift), on int64
    with wrapping arithmetic: few passes over the data, which is what the digest's time is."""
    x = x * _C1
    x = (x ^ _shr(x, 32)) * _C2
    return x ^ _shr(x, 32)


def _words(t: torch.Tensor) -> tuple[torch.Tensor, int]:
    """The tensor's bits as one int64 per unit (an element, or a byte for odd sizes); units per element."""
    t = t.detach().contiguous()
    size = t.element_size()
    if t.dtype.is_complex or size not in _WORD:
        return t.reshape(-1).view(torch.uint8).to(torch.int64), size
    return t.reshape(-1).view(_WORD[size]).to(torch.int64), 1


CHUNK = 1 << 22
"""Elements hashed per batch (a few int64 temporaries of this many: 32 MiB each), whatever the state's
size; small tensors share a batch, large ones are hashed in slices."""


class _Local:
    """What this rank adds of one tensor: its local values and where they sit in the global tensor."""

    def __init__(
        self, values: torch.Tensor, shape: tuple[int, ...], offset: tuple[int, ...], full: tuple[int, ...]
    ):
        self.words, self.units = _words(values.cpu())
        self.shape, self.offset, self.full = shape, offset, full
        self.strides = [math.prod(full[d + 1 :]) for d in range(len(full))]

    def index(self, start: int, stop: int) -> torch.Tensor:
        """Global flat unit index of local units start..stop (row-major; units within an element last)."""
        if self.shape[1:] == self.full[1:]:  # whole rows (FSDP's dim-0 shards): one range of the tensor
            first = (self.offset[0] * self.strides[0] if self.shape else 0) * self.units
            return torch.arange(first + start, first + stop, dtype=torch.int64)
        j = torch.arange(start, stop, dtype=torch.int64)
        element, unit = j // self.units, j % self.units
        index = torch.zeros_like(element)
        rest = element
        for d in reversed(range(len(self.shape))):
            coord = rest % self.shape[d]
            rest = rest // self.shape[d]
            index += (coord + self.offset[d]) * self.strides[d]
        return index * self.units + unit


def _local_part(t: torch.Tensor) -> _Local | None:
    """What this rank adds of `t`, or None when another rank adds it."""
    if isinstance(t, DTensor):
        placements = t.placements
        if any(type(p) not in (Shard, Replicate) for p in placements):  # e.g. strided shards: gather it
            full = t.full_tensor()
            shape = tuple(full.shape)
            return _Local(full, shape, (0,) * len(shape), shape) if dist.get_rank() == 0 else None
        coordinate = t.device_mesh.get_coordinate()
        if coordinate is None or any(
            isinstance(p, Replicate) and c != 0 for p, c in zip(placements, coordinate, strict=True)
        ):
            return None
        shape, offset = compute_local_shape_and_global_offset(t.shape, t.device_mesh, placements)
        return _Local(t.to_local(), tuple(shape), tuple(offset), tuple(t.shape))
    if dist.is_initialized() and dist.get_rank() != 0:
        return None
    shape = tuple(t.shape)
    return _Local(t, shape, (0,) * len(shape), shape)


def _seed(key: str, lane: int) -> int:
    return _signed(int.from_bytes(hashlib.sha256(f"{lane}:{key}".encode()).digest()[:8], "little"))


def _pieces(locals_: list[_Local | None]) -> Iterator[tuple[int, torch.Tensor, torch.Tensor]]:
    """(tensor number, words, global unit indices) in slices of at most CHUNK units."""
    for number, local in enumerate(locals_):
        if local is None:
            continue
        n = local.words.numel()
        for start in range(0, n, CHUNK):
            stop = min(start + CHUNK, n)
            yield number, local.words[start:stop], local.index(start, stop)


def _batches(
    locals_: list[_Local | None],
) -> Iterator[tuple[list[int], list[int], torch.Tensor, torch.Tensor]]:
    """(tensor numbers, their unit counts, words, indices) of about CHUNK units each: many small tensors
    in one batch, large ones in slices."""
    numbers: list[int] = []
    counts: list[int] = []
    words: list[torch.Tensor] = []
    indices: list[torch.Tensor] = []
    size = 0
    for number, w, i in _pieces(locals_):
        numbers.append(number)
        counts.append(w.numel())
        words.append(w)
        indices.append(i)
        size += w.numel()
        if size >= CHUNK:
            yield numbers, counts, torch.cat(words), torch.cat(indices)
            numbers, counts, words, indices, size = [], [], [], [], 0
    if counts:
        yield numbers, counts, torch.cat(words), torch.cat(indices)


def tensor_limbs(keys: list[str], tensors: list[torch.Tensor]) -> torch.Tensor:
    """This rank's part of each tensor's lanes: [tensor, LANES, _LIMBS] partial sums (zeros for what
    another rank adds)."""
    out = torch.zeros(len(tensors), LANES, _LIMBS, dtype=torch.int64)
    if not tensors:
        return out
    locals_ = [_local_part(t) for t in tensors]
    seeds = torch.tensor([[_seed(k, lane) for lane in range(LANES)] for k in keys], dtype=torch.int64)
    for numbers, counts, words, index in _batches(locals_):
        # Sums per piece by running sums (exact, in order; index_add_ with repeated indices raced across
        # threads and gave another digest now and then).
        which = torch.tensor(numbers)
        ends = torch.tensor(counts).cumsum(0) - 1
        spread = index * _GOLDEN
        for lane in range(LANES):
            h = _mix(words ^ (spread + torch.repeat_interleave(seeds[which, lane], torch.tensor(counts))))
            for limb in range(_LIMBS):
                running = (_shr(h, _LIMB_BITS * limb) & _LIMB_MASK).cumsum(0)[ends]  # < 2**54: exact
                out[which, lane, limb] += torch.diff(running, prepend=torch.zeros(1, dtype=torch.int64))
        _carry(out)
    return out


def _carry(limbs: torch.Tensor) -> None:
    """Normalize [..., _LIMBS] limb sums to _LIMB_BITS each, modulo 2**64 (so the ranks' sum fits)."""
    for limb in range(_LIMBS - 1):
        limbs[..., limb + 1] += limbs[..., limb] >> _LIMB_BITS
        limbs[..., limb] &= _LIMB_MASK
    limbs[..., _LIMBS - 1] &= _LIMB_MASK


def leaves(value: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(dotted key, leaf) of a nested state dict, keys sorted (the same order on every rank)."""
    if isinstance(value, dict):
        for key in sorted(value, key=str):
            yield from leaves(value[key], f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            yield from leaves(item, f"{prefix}[{i}]")
    else:
        yield prefix, value


def sharded_digests(
    parts: dict[str, Any], device: torch.device | None = None, group: Any = None
) -> dict[str, bytes] | None:
    """sha256 of each part (a nested state dict of DTensors, tensors and plain values) as if unsharded;
    on rank 0, None elsewhere. A collective (one all_reduce, of a small tensor on `device`: the training
    group's, e.g. CUDA under NCCL); every rank passes the same structure. Plain values are rank 0's."""
    keyed = [(name, key, leaf) for name, part in parts.items() for key, leaf in leaves(part)]
    tensors = [(name, key, leaf) for name, key, leaf in keyed if isinstance(leaf, torch.Tensor)]
    sums = tensor_limbs([f"{name}/{key}" for name, key, _ in tensors], [leaf for _, _, leaf in tensors])
    if dist.is_initialized():
        reduced = sums.to(device) if device is not None else sums
        dist.all_reduce(reduced, group=group)
        sums = reduced.cpu()
    if dist.is_initialized() and dist.get_rank(group) != 0:
        return None
    lanes = iter(sums.tolist())
    digests = {name: hashlib.sha256() for name in parts}
    for name, key, leaf in keyed:
        digest = digests[name]
        digest.update(f"<{key}>".encode())
        if isinstance(leaf, torch.Tensor):
            digest.update(f"{leaf.dtype}{tuple(leaf.shape)}".encode())
            for limbs in next(lanes):
                value = sum(int(v) << (_LIMB_BITS * i) for i, v in enumerate(limbs)) % (1 << 64)
                digest.update(value.to_bytes(8, "little"))
        else:
            digest.update(repr(leaf).encode())
    return {name: d.digest() for name, d in digests.items()}
