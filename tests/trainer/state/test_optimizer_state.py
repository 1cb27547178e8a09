"""A fresh worker's restore creates the optimizer's state without an optimizer step
(trainer/state/save_dict.py: create_optimizer_state), on a 1-rank FSDP2 mesh in this process."""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import _init_optim_state

from tests.trainer._ckpt import SMALL
from trainer.reference.model import build_model
from trainer.state import codec
from trainer.state.save_dict import build_save_dict, create_optimizer_state


def _layout(state: dict[str, Any]) -> str:
    skeleton, tensors = codec.flatten(build_save_dict(state, rank=0))
    return codec.layout_id(skeleton, codec.plan(tensors)[0])


def test_optimizer_state_is_created_as_its_first_step_would(one_rank: Any) -> None:
    ours, dcps = (build_model(SMALL, mesh=one_rank, device=torch.device("cpu"), seed=3) for _ in range(2))
    weights = {k: v.full_tensor().clone() for k, v in ours.state_dict().items()}
    optim = torch.optim.AdamW(ours.parameters(), lr=1e-2)
    reference = torch.optim.AdamW(dcps.parameters(), lr=1e-2)

    create_optimizer_state(optim)
    _init_optim_state(reference)  # what DCP's get_state_dict does otherwise: a step with lr 0

    assert len(optim.state) == len(list(ours.parameters())) == len(reference.state)
    # The same tensors (keys, dtypes, local shapes, placements), so snapshots and checkpoints of either
    # load into the other; the snapshot layout id is what a restore checks.
    assert _layout({"model": ours, "optim": optim}) == _layout({"model": dcps, "optim": reference})
    for p, q in zip(ours.parameters(), dcps.parameters(), strict=True):
        mine, theirs = optim.state[p], reference.state[q]
        assert mine.keys() == theirs.keys()
        for key in mine:
            assert type(mine[key]) is type(theirs[key]) and mine[key].dtype == theirs[key].dtype, key
            if isinstance(mine[key], torch.distributed.tensor.DTensor):
                assert mine[key].placements == theirs[key].placements, key
        assert p.grad is None  # the stand-in gradient is gone
    # Nothing was computed: the weights are untouched and the moments are zero.
    assert all(torch.equal(v.full_tensor(), weights[k]) for k, v in ours.state_dict().items())
    assert all(float(s["exp_avg"].full_tensor().abs().sum()) == 0 for s in optim.state.values())


def test_optimizer_state_leaves_other_optimizers_and_existing_state_alone(one_rank: Any) -> None:
    model = build_model(SMALL, mesh=one_rank, device=torch.device("cpu"), seed=3)
    sgd = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9)
    create_optimizer_state(sgd)
    assert not sgd.state  # not an Adam: DCP's own initialisation handles it

    adam = torch.optim.AdamW(model.parameters(), lr=1e-2)
    create_optimizer_state(adam)
    first = next(iter(adam.state.values()))
    first["step"].fill_(5)
    create_optimizer_state(adam)  # has state: left as it is
    assert float(next(iter(adam.state.values()))["step"]) == 5
