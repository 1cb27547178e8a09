"""A per-rank entry's state dict (the loop's step, data position and RNG streams, the scheduler, a team's
state) as one self-describing byte string, and back.

DCP loads into a template: the fresh object's own state dict. For model and optimizer that is right
(their structure is fixed by the model), but a team's entry may grow (a dict gaining a key per step) or
have keys of any type, and a template built from the fresh object then drops the new keys, or turns int
keys into DCP's string paths beside the stale ones. One opaque value per entry needs no template: the
whole state dict comes back as it was saved, key types and all. The encoding is the snapshot codec's
(trainer/state/codec.py: a JSON skeleton with tagged tuples and keys, raw tensor bytes), so nothing in
it is pickled; DCP stores the byte string as its own pickled `bytes`, read only after the checkpoint's
manifest and digests are verified (trainer/checkpoint/resume.py).
"""

from __future__ import annotations

import json
import struct
from typing import Any

import torch

from trainer.state import codec

MAGIC = b"TRENTRY1"
_HEADER = struct.Struct("<8sQ")
MAX_HEADER = 64 << 20


def encode(state: Any) -> bytes:
    """The state dict as bytes: magic, header length, JSON header (skeleton and slots), tensor bytes."""
    skeleton, tensors = codec.flatten(state)
    slots, total = codec.plan(tensors)
    header = json.dumps(
        {
            "skeleton": skeleton,
            "slots": [[s.dtype, list(s.shape), s.offset, s.nbytes] for s in slots],
            "total": total,
        },
        separators=(",", ":"),
    ).encode()
    payload = bytearray(total)
    for tensor, slot in zip(tensors, slots, strict=True):
        flat = tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8)
        payload[slot.offset : slot.offset + slot.nbytes] = flat.numpy().tobytes()
    return _HEADER.pack(MAGIC, len(header)) + header + bytes(payload)


def decode(blob: Any) -> Any:
    """The state dict `encode` wrote; ValueError for anything else (a truncated or foreign value)."""
    if not isinstance(blob, bytes | bytearray) or len(blob) < _HEADER.size:
        raise ValueError(f"not an encoded entry ({type(blob).__name__})")
    magic, length = _HEADER.unpack_from(blob)
    if magic != MAGIC or length > min(MAX_HEADER, len(blob) - _HEADER.size):
        raise ValueError("not an encoded entry (bad magic or header length)")
    try:
        header = json.loads(bytes(blob[_HEADER.size : _HEADER.size + length]))
    except ValueError:
        raise ValueError("encoded entry: its header is not JSON") from None
    if not isinstance(header, dict):
        raise ValueError("encoded entry: its header is not an object")
    payload = memoryview(blob)[_HEADER.size + length :]
    if header.get("total") != len(payload):
        raise ValueError(f"encoded entry: {len(payload)} payload bytes, its header: {header.get('total')}")
    tensors = []
    for dtype_name, shape, offset, nbytes in header["slots"]:
        dtype = codec.dtype_of(dtype_name)
        count = 1
        for dim in shape:
            count *= int(dim)
        if count * torch.empty(0, dtype=dtype).element_size() != nbytes or offset + nbytes > len(payload):
            raise ValueError("encoded entry: a tensor's size does not match its slot")
        raw = bytearray(payload[offset : offset + nbytes])
        tensor = torch.frombuffer(raw, dtype=dtype) if nbytes else torch.empty(0, dtype=dtype)
        tensors.append(tensor.reshape([int(d) for d in shape]))
    return codec.decode(header["skeleton"], lambda i: tensors[i])
