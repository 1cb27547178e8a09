"""The save dict of each snapshot, built once per attempt and reused while the live tensors stay put.

Building a save dict (torch's get_state_dict: FQN mapping, option checks, a DTensor per parameter) and
flattening it is a large share of a snapshot's time (docs/history.md), every step, to produce the same
tensors again: FSDP2's sharded parameters and AdamW's moments are the same objects, in the same memory,
from step to step. So the first snapshot of an attempt keeps the model and optimizer part of its save
dict and its codec.Plan (the local tensors and their payload offsets), and each later snapshot

- checks the live objects against it (`live_key`: every parameter's and buffer's identity and local
  storage pointer, shape, stride and dtype; every optimizer state dict's identity and its tensors' the
  same way; the param groups' keys): any difference builds everything again;
- refreshes what does change: the param groups' values (a scheduler's lr) from the optimizer, and the
  per-rank entries (step, data position, RNG), encoded afresh;
- re-encodes the skeleton with the plan's tensors (codec.skeleton_with: the same objects in the same
  order, or it builds again).

The reuse is taken only when the kept save dict is provably the live state's: its optimizer state holds
the optimizer's own per-parameter dicts (so their non-tensor values are current), its param groups
carry exactly the optimizer's values, its model tensors are views of exactly the live parameters and
buffers, and no state-dict hook could make a fresh build differ. Otherwise every snapshot builds afresh,
as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain
from typing import Any

import torch
from torch import nn

from trainer.state import codec
from trainer.state.save_dict import MODEL, OPTIM, build_save_dict, per_rank_entries


@dataclass
class _Kept:
    key: tuple[Any, ...]
    base: dict[str, Any]  # the save dict's model and optimizer entries (live references)
    groups: list[tuple[dict[str, Any], dict[str, Any]]]  # (kept param group, the optimizer's)
    plan: codec.Plan


class SavePlan:
    """One process's snapshot save dicts; `reset` at each attempt (a restore), so nothing of a torn-down
    attempt is kept alive or reused."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self._kept: _Kept | None = None
        self.builds = 0
        """Save dicts built from scratch (for tests and logs)."""

    def reset(self) -> None:
        self._kept = None

    def build(self, state: dict[str, Any]) -> tuple[dict[str, Any], codec.Flat]:
        """The save dict of `state` now and its flattened form."""
        kept = self._kept
        if kept is not None:
            key = live_key(state)
            if key == kept.key:
                for mine, theirs in kept.groups:
                    for k in mine:
                        if k != "params":
                            mine[k] = theirs[k]
                save_dict = {**kept.base, **per_rank_entries(state, self.rank)}
                try:
                    return save_dict, codec.Flat(codec.skeleton_with(save_dict, kept.plan), kept.plan)
                except codec.Stale:
                    pass
        self._kept = None
        save_dict = build_save_dict(state, self.rank)
        flat = codec.flat(save_dict)
        self.builds += 1
        self._kept = _keep(state, save_dict, flat.plan)
        return save_dict, flat


def _local(t: torch.Tensor) -> torch.Tensor:
    """A DTensor's local tensor without to_local's autograd dispatch (torch is pinned exactly)."""
    return getattr(t, "_local_tensor", t)


def _where(t: torch.Tensor) -> tuple[Any, ...]:
    loc = _local(t)
    return (loc.data_ptr(), tuple(loc.shape), loc.stride(), loc.dtype, loc.device)


def live_key(state: dict[str, Any]) -> tuple[Any, ...]:
    """What the kept save dict depends on, read from the live objects (cheap: no state dict built).

    A parameter whose storage changed (`p.data = ...`, a re-materialised shard), a new or replaced
    optimizer state, a param group gaining a key: each changes the key."""
    model, optim = state[MODEL], state.get(OPTIM)
    out: list[Any] = [id(model), id(optim), tuple(k for k in state if k not in (MODEL, OPTIM))]
    for t in chain(model.parameters(), model.buffers()):
        out.append((id(t), *_where(t)))
    if optim is not None:
        for g in optim.param_groups:
            out.append(tuple(k for k in g if k != "params"))
            for p in g["params"]:
                st = optim.state.get(p)
                out.append(id(st))
                if st:
                    for k, v in st.items():
                        out.append((k, id(v), *_where(v)) if isinstance(v, torch.Tensor) else (k, type(v)))
    return tuple(out)


def _keep(state: dict[str, Any], save_dict: dict[str, Any], p: codec.Plan) -> _Kept | None:
    """What to keep of a fresh build, or None when reusing it could ever differ from a fresh build."""
    model, optim = state[MODEL], state.get(OPTIM)
    if _has_state_dict_hooks(model, optim):
        return None
    model_sd = save_dict[MODEL]
    if not all(isinstance(v, torch.Tensor) for v in model_sd.values()):
        return None  # extra state: values the key cannot see
    live = {_where(t) for t in chain(model.parameters(), model.buffers())}
    if any(_where(v) not in live for v in model_sd.values()):
        return None  # a model tensor that is not a view of a live parameter or buffer
    groups: list[tuple[dict[str, Any], dict[str, Any]]] = []
    if optim is not None:
        osd = save_dict[OPTIM]
        own = {id(st) for st in optim.state.values()}
        if len(osd.get("state", {})) != len(own) or any(id(v) not in own for v in osd["state"].values()):
            return None  # copies of the optimizer's state dicts: their values would go stale
        kept_groups = osd.get("param_groups", [])
        if len(kept_groups) != len(optim.param_groups):
            return None
        for mine, theirs in zip(kept_groups, optim.param_groups, strict=True):
            if set(mine) != set(theirs) or any(mine[k] is not theirs[k] for k in mine if k != "params"):
                return None
            groups.append((mine, theirs))
    base = {k: v for k, v in save_dict.items() if k in (MODEL, OPTIM)}
    return _Kept(live_key(state), base, groups, p)


def _has_state_dict_hooks(model: nn.Module, optim: Any) -> bool:
    if optim is not None and (
        getattr(optim, "_optimizer_state_dict_pre_hooks", None)
        or getattr(optim, "_optimizer_state_dict_post_hooks", None)
    ):
        return True
    return any(type(m).get_extra_state is not nn.Module.get_extra_state for m in model.modules())
