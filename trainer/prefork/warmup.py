"""The zygote's warm-up: run the restart path's first-time work once, so every forked worker skips it.

Why: after the imports (PRELOAD), the next largest cost of a restarted worker is its first pass through
FSDP2's DTensor code: building and sharding the model, creating the optimizer's state and the
checkpoint state dict. DTensor propagates shardings through a fake-tensor trace the first time it sees
an operator with given input specs and caches the result per process. Measured on the demo's tiny
model (2 ranks, gloo, quiet 2-core machine): a cold process spends 1.0-1.4 s building the model and
0.5-0.7 s in a snapshot restore's state-dict calls; forked from a warmed parent, 0.11-0.17 s and
0.14-0.38 s.

How: before it serves, the zygote builds the run's model and optimizer exactly as a (re)start does
(trainer.session.build_model_and_optimizer) on the CPU, under a "fake" process group of the job's world
size, rank 0 (torch's in-process stand-in: no peers, no sockets, no threads), takes the checkpoint state
dict and applies it back, then drops everything. The sharding caches are keyed by the mesh and the
global shapes, so a CPU run reuses them exactly; a GPU run (whose meshes are CUDA ones) is warmed with
the tiny preset, which still moves the one-time initialisation out of the restart, and never touches
CUDA: a process that initialised CUDA cannot fork usable children.

Fork safety: the warm-up runs with one intra-op thread, so OpenMP never starts its thread pool here (a
child forked from a process whose OpenMP pool exists hangs at its first parallel region); the forked
worker gets the thread count back (`restore_threads`). The zygote checks afterwards that it is still a
single OS thread; if not it serves cold instead (server.py execs itself again without the warm-up).
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass
from typing import NoReturn

TRAINER_MODULE = ("-m", "trainer")

_threads_before: int | None = None  # the zygote's intra-op thread count before the warm-up


@dataclass(frozen=True)
class WarmupPlan:
    """What the warm-up builds: the run's model (or the tiny one for a GPU run) at the job's world size."""

    preset: str
    world_size: int
    seed: int
    lr: float

    def describe(self) -> str:
        return f"preset {self.preset}, world size {self.world_size}"


def plan_from_command(command: list[str]) -> WarmupPlan | str:
    """The warm-up for the pod command `command` (`ft_launcher ... -m trainer ...`), or why there is none.

    Reads only what it needs (the launcher's --nnodes and --nproc-per-node, the trainer's --preset,
    --device, --seed and --lr) and validates nothing: the worker itself validates its configuration and
    says what is wrong, so a pod command the warm-up does not understand only means no warm-up.
    """
    starts = [i for i in range(len(command) - 1) if tuple(command[i : i + 2]) == TRAINER_MODULE]
    if not starts:
        return "no `-m trainer` in the pod command"
    launcher, trainer = command[: starts[0]], command[starts[0] + 2 :]
    nnodes, nproc = _flag(launcher, "--nnodes"), _flag(launcher, "--nproc-per-node", "--nproc_per_node")
    try:
        # A hot-spare range N:M: the world is N nodes (the spares stand by outside it).
        world_size = int((nnodes or "1").split(":")[0]) * int(nproc or "1")
    except ValueError:
        return f"cannot read the world size from --nnodes={nnodes} --nproc-per-node={nproc}"
    if world_size < 1:
        return f"world size {world_size}"
    from trainer.config import make_parser
    from trainer.model import PRESETS

    args = _parse_known(make_parser(), trainer)
    if args is None:
        return "the trainer's flags do not parse (the worker will say why)"
    preset = args.preset if args.device == "cpu" else "tiny"
    if preset not in PRESETS:
        return f"unknown preset {preset!r}"
    return WarmupPlan(preset=preset, world_size=world_size, seed=args.seed, lr=args.lr)


def run(plan: WarmupPlan) -> float:
    """Warm this process's DTensor paths for `plan`; returns the seconds it took. Leaves no process
    group, model or optimizer behind; raises whatever failed (the zygote then serves cold)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.testing._internal.distributed.fake_pg import FakeStore  # registers the "fake" backend

    from trainer.checkpoint.state import apply_loaded, build_save_dict
    from trainer.model import PRESETS
    from trainer.session import build_model_and_optimizer

    global _threads_before
    t0 = time.perf_counter()
    _threads_before = torch.get_num_threads()
    torch.set_num_threads(1)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=plan.world_size)
    try:
        # A mesh that never compares equal to a worker's (its dimension is named): DTensor's caches are
        # keyed by the mesh, and some of what they keep is this process's rank (0 here), which a worker
        # of another rank must not find. Sharing them was tried: the checkpoint plan then saw every rank
        # write rank 0's shard. So a worker still fills its own caches; what it skips is every cost that
        # is per process rather than per mesh (lazy imports, operator registration, fake-tensor setup).
        mesh = init_device_mesh("cpu", (plan.world_size,), mesh_dim_names=("prefork-warmup",))
        model, optim = build_model_and_optimizer(
            PRESETS[plan.preset], mesh, torch.device("cpu"), plan.seed, plan.lr
        )
        state = {"model": model, "optim": optim}
        # What a snapshot or checkpoint restore does first: the optimizer's state (one lr-0 step) and the
        # state dict, then pushing one back.
        apply_loaded(state, build_save_dict(state, rank=0), rank=0)
        del state, model, optim, mesh
    finally:
        dist.destroy_process_group()
    return time.perf_counter() - t0


def os_threads() -> int:
    """OS threads of this process (Linux: /proc/self/task); 1 when it cannot tell."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return 1


def restore_threads() -> None:
    """In a forked worker: the intra-op thread count the zygote had before its single-threaded warm-up."""
    if _threads_before is not None:
        import torch

        torch.set_num_threads(_threads_before)


def _flag(argv: list[str], *names: str) -> str | None:
    """The value of the last `--name=value` or `--name value` in argv."""
    found = None
    for i, token in enumerate(argv):
        for name in names:
            if token.startswith(name + "="):
                found = token.split("=", 1)[1]
            elif token == name and i + 1 < len(argv):
                found = argv[i + 1]
    return found


def _parse_known(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace | None:
    """parse_known_args, None on any error (argparse would print usage and exit the zygote)."""

    def fail(message: str) -> NoReturn:
        raise ValueError(message)

    parser.error = fail  # type: ignore[method-assign]
    parser.exit_on_error = False
    try:
        return parser.parse_known_args(argv)[0]
    except (argparse.ArgumentError, ValueError):
        return None
