"""A restarted worker's first-time costs, cut (issue 10): the optimizer state created without an optimizer
step, and the prefork zygote's warm-up (trainer/prefork/warmup.py).

The state-dict test runs on a 1-rank FSDP2 mesh in this process; the warm-up tests run the zygote's
warm-up in a child process (it builds a process group and sets torch's thread count), then fork from
it the way the zygote does.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.distributed.checkpoint.state_dict import _init_optim_state

from tests.trainer._ckpt import SMALL
from trainer.checkpoint.state import build_save_dict, create_optimizer_state
from trainer.model import build_model
from trainer.prefork import warmup
from trainer.snapshot import codec

REPO = Path(__file__).resolve().parents[2]
POD = ["ft_launcher", "--nnodes=2:3", "--nproc-per-node=2", "--max-restarts=3", "-m", "trainer"]
TRAINER = ["--data-path", "/data/tokens.npy", "--out-dir", "/out", "--device", "cpu", "--seed", "7"]


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


@pytest.mark.parametrize(
    ("command", "expected"),
    [
        (POD + TRAINER, warmup.WarmupPlan(preset="tiny", world_size=4, seed=7, lr=3e-4)),
        (  # space-separated flags, the underscore spelling, a GPU run: the tiny model on the CPU
            [
                "ft_launcher",
                "--nnodes",
                "3",
                "--nproc_per_node",
                "8",
                "-m",
                "trainer",
                *TRAINER[:4],
                "--device",
                "cuda",
                "--preset",
                "small",
                "--lr",
                "0.01",
            ],
            warmup.WarmupPlan(preset="tiny", world_size=24, seed=1234, lr=0.01),
        ),
        ([*POD, *TRAINER, "--preset", "small"], warmup.WarmupPlan("small", 4, 7, 3e-4)),
    ],
)
def test_warmup_plan_reads_the_pod_command(command: list[str], expected: warmup.WarmupPlan) -> None:
    assert warmup.plan_from_command(command) == expected


@pytest.mark.parametrize(
    ("command", "why"),
    [
        (["ft_launcher", "--nnodes=2", "train.py"], "no `-m trainer`"),
        (["ft_launcher", "--nnodes=two", "-m", "trainer", *TRAINER], "cannot read the world size"),
        ([*POD, *TRAINER, "--lr", "fast"], "do not parse"),
        ([*POD, "--device", "cpu"], "do not parse"),  # --data-path missing: the worker says so itself
        ([*POD, *TRAINER, "--preset", "huge"], "unknown preset"),
    ],
)
def test_warmup_plan_says_why_there_is_none(command: list[str], why: str) -> None:
    found = warmup.plan_from_command(command)
    assert isinstance(found, str) and why in found, found


WARM_THEN_FORK = textwrap.dedent(
    """
    import json, os, sys, time
    import torch, torch.distributed as dist
    from trainer.prefork import warmup
    torch.set_num_threads(2)
    plan = warmup.plan_from_command(json.loads(sys.argv[1]))
    threads = warmup.os_threads()
    took = warmup.run(plan)
    report = {"took": took, "threads_added": warmup.os_threads() - threads,
              "group_left": dist.is_initialized(), "intra_op_after": torch.get_num_threads()}
    pid = os.fork()
    if pid == 0:  # as a forked worker: its thread count back, then a multi-threaded op must not hang
        warmup.restore_threads()
        x = torch.randn(512, 512)
        total = float((x @ x).sum() + torch.randn(1 << 21).cos().sum())
        line = json.dumps({"child_threads": torch.get_num_threads(), "ok": total == total})
        os.write(1, (line + "\\n").encode())
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    report["child_status"] = status
    print(json.dumps(report), flush=True)
    """
)


def test_warmup_leaves_a_process_that_forks_usable_workers() -> None:
    out = subprocess.run(
        [sys.executable, "-c", WARM_THEN_FORK, json.dumps(POD + TRAINER)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    child, parent = (json.loads(line) for line in out.stdout.strip().splitlines()[-2:])
    assert parent["child_status"] == 0
    assert parent["threads_added"] == 0  # still safe to fork: no thread left behind
    assert not parent["group_left"]  # the fake process group is gone
    assert parent["intra_op_after"] == 1  # the warm-up ran single-threaded (no OpenMP pool to copy)
    assert child == {"child_threads": 2, "ok": True}
