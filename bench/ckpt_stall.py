"""Checkpoint stall: how long a save blocks the training loop, per checkpoint mode.

    python -m bench.ckpt_stall [--mib 256 ...] [--reps 5] [--world-size 2] [--modes sync,torch-async,nvrx]
                               [--dir DIR] [--device cpu|cuda] [--quick] --out results.json

For each size (MiB of state per rank) it starts `world_size` ranks on gloo (2 by default), builds an
FSDP2-sharded stack of linear layers holding that much per rank, and for each mode runs the real
trainer.checkpoint.CheckpointManager: one warm-up save (NVRx starts its worker there; reported apart as
first_save_s), then `reps` saves, each followed by wait() so saves do not overlap. Per save the figure is
the largest blocked_s over ranks (the next collective makes every rank wait for the slowest). Next to the
modes it reports the floor: one in-memory copy of the same state into preallocated CPU buffers, the least
any snapshot-then-write scheme must block. commit_s is save start -> checkpoint visible (wait included).

Output: {"rows": [flat dicts with median/min/max spreads], "note", "config"} (read by bench.report).
Timings on a shared 2-core machine are noisy: read medians with their spread. The checkpoint directory is
local disk here (FSx on the cluster).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.stats import spread
from trainer.runtime.ports import free_port

MODES = ("sync", "torch-async", "nvrx", "nvrx-from-snapshot")
"""The checkpoint modes, and `nvrx-from-snapshot`: the chart's default (nvrx with a snapshot every step),
where each save is written from the snapshot of its step (trainer/checkpoint/from_snapshot.py) and what
the loop waits for is the snapshot plus the save's hold of its slot, reported together."""
LAYER_DIM = 1024  # one Linear(1024, 1024) = 4 MiB of fp32 weights, 4 / world_size MiB per rank


def _layers_for(mib_per_rank: int, world_size: int) -> int:
    per_layer_mib_per_rank = LAYER_DIM * LAYER_DIM * 4 / 2**20 / world_size
    return max(1, round(mib_per_rank / per_layer_mib_per_rank))


def _rank_main(rank: int, world_size: int, port: int, job: dict[str, Any], result_path: str) -> None:
    """One rank: build the state, time the floor and every mode; rank 0 writes the results."""
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed._state_dict_utils import _create_cpu_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from trainer.checkpoint import CheckpointConfig, CheckpointManager
    from trainer.state.save_dict import build_save_dict, copy_into

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    # One intra-op thread per rank, as torchrun/ft_launcher set it: ranks sharing cores with spinning
    # OpenMP pools turn a millisecond memcpy into a scheduler time slice.
    torch.set_num_threads(1)
    cuda = job["device"] == "cuda"
    if cuda:
        torch.cuda.set_device(rank)
    dist.init_process_group("cpu:gloo,cuda:nccl" if cuda else "gloo", rank=rank, world_size=world_size)
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    mesh = init_device_mesh(device.type, (world_size,))
    out: dict[str, Any] = {"sizes": {}}
    for mib in job["mib"]:
        n_layers = _layers_for(mib, world_size)
        with torch.device("meta"):
            model = nn.Sequential(*(nn.Linear(LAYER_DIM, LAYER_DIM, bias=False) for _ in range(n_layers)))
        for layer in model:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        model.to_empty(device=device)
        shards = [p.to_local() for p in model.parameters()]  # type: ignore[attr-defined]  # DTensors
        with torch.no_grad():
            for shard in shards:
                shard.uniform_(-1, 1)  # real bytes (never-touched pages would flatter the copies)
        state = {"model": model}
        local_mib = sum(shard.numel() * 4 for shard in shards) / 2**20
        del shards

        # Floor: one copy of the same state into preallocated CPU buffers (the nvrx mode's staging copy).
        sd = build_save_dict(state, rank)
        buffers = _create_cpu_state_dict(sd)
        floor = []
        for _ in range(job["reps"] + 1):
            dist.barrier()
            t0 = time.perf_counter()
            copy_into(sd, buffers)
            if cuda:
                torch.cuda.synchronize()
            floor.append(_max_over_ranks(time.perf_counter() - t0))
        del buffers
        size_out: dict[str, Any] = {"local_mib": local_mib, "layers": n_layers, "floor_s": floor[1:]}
        for mode in job["modes"]:
            root = Path(job["dir"]) / f"{mib}mib-{mode}"
            from_snapshot = mode == "nvrx-from-snapshot"
            kind = "nvrx" if from_snapshot else mode
            cfg = CheckpointConfig(dir=root, interval_steps=1, keep_latest=1, mode=kind, write_timeout_s=600)
            mgr = CheckpointManager(cfg, rank=rank, world_size=world_size)
            snaps = _snapshots(Path(job["shm"]) / f"{mib}mib", rank, world_size) if from_snapshot else None
            blocked, commit, snapshot_part = [], [], []
            for step in range(job["reps"] + 1):
                dist.barrier()
                t0 = time.perf_counter()
                snap = snaps.after_step(step, state) if snaps is not None else None
                snapped = time.perf_counter() - t0
                res = mgr.save(step, state, snap.reusable if snap is not None else None)
                held = time.perf_counter() - t0  # the snapshot and the save's hold: what the loop waits for
                mgr.wait()
                blocked.append(_max_over_ranks(held if snap is not None else res.blocked_s))
                if snap is not None:
                    snapshot_part.append(_max_over_ranks(snapped))
                commit.append(_max_over_ranks(time.perf_counter() - t0))
            mgr.close()
            if snaps is not None:
                snaps.finish()
            size_out[mode] = {"first_save_s": blocked[0], "blocked_s": blocked[1:], "commit_s": commit[1:]}
            if snaps is not None:  # of which the snapshot itself (the rest: the save's hold of the slot)
                size_out[mode]["snapshot_s"] = snapshot_part[1:]
            # The closed manager's staging copies go now, not whenever the cyclic collector next runs
            # (tensors do not count towards its thresholds): at 1 GiB per rank the four modes' leftovers
            # held ~10 GiB per rank and the kernel killed a rank on a 24 GiB machine.
            del mgr, res, snap, snaps
            gc.collect()
        out["sizes"][str(mib)] = size_out
        del model, state, sd
        gc.collect()
    if rank == 0:
        Path(result_path).write_text(json.dumps(out))
    dist.barrier()
    dist.destroy_process_group()


def _snapshots(directory: Path, rank: int, world_size: int) -> Any:
    """A snapshot every step into `directory` (a tmpfs), no peer replication: the trainer's Snapshots."""
    from trainer.snapshot.config import SnapshotConfig
    from trainer.snapshot.manager import Snapshots

    cfg = SnapshotConfig(interval_steps=1, dir=directory, replication=False)
    return Snapshots(cfg, rank=rank, world_size=world_size, fingerprint="bench.ckpt_stall")


def _max_over_ranks(value: float) -> float:
    import torch
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.float64)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def measure(
    mib: Sequence[int] = (256,),
    *,
    reps: int = 5,
    world_size: int = 2,
    modes: Sequence[str] = MODES,
    directory: Path | None = None,
    device: str = "cpu",
    timeout_s: float = 1800.0,
) -> dict[str, Any]:
    """Run the benchmark and return {"rows", "note", "config", "raw"} (see the module docstring)."""
    import torch.multiprocessing as mp

    for mode in modes:
        if mode not in MODES:
            raise ValueError(f"modes: unknown mode {mode!r} (choose from {', '.join(MODES)})")
    if reps < 1 or world_size < 1 or not mib or min(mib) < 1:
        raise ValueError("reps, world_size and every mib must be >= 1")
    shm_root = "/dev/shm" if Path("/dev/shm").is_dir() else None  # snapshots live in host memory
    with (
        tempfile.TemporaryDirectory(prefix="ckpt-stall-", dir=directory) as tmp,
        tempfile.TemporaryDirectory(prefix="ckpt-stall-snap-", dir=shm_root) as shm,
    ):
        job = {"mib": list(mib), "reps": reps, "modes": list(modes), "dir": tmp, "shm": shm, "device": device}
        result_path = str(Path(tmp) / "result.json")
        ctx = mp.start_processes(
            _rank_main,
            args=(world_size, free_port(), job, result_path),
            nprocs=world_size,
            join=False,
            start_method="spawn",
        )
        deadline = time.monotonic() + timeout_s
        while not ctx.join(timeout=5):
            if time.monotonic() > deadline:
                for proc in ctx.processes:
                    proc.kill()
                raise TimeoutError(f"ckpt_stall did not finish within {timeout_s} s")
        raw = json.loads(Path(result_path).read_text())
    return {
        "rows": _rows(raw, modes),
        "note": _note(world_size, reps, device),
        "config": job | {"world_size": world_size, "machine": f"{platform.node()} ({os.cpu_count()} CPUs)"},
        "raw": raw,
    }


def _rows(raw: dict[str, Any], modes: Sequence[str]) -> list[dict[str, Any]]:
    rows = []
    for mib, size in raw["sizes"].items():
        floor = spread(size["floor_s"], with_values=True)
        rows.append(
            {
                "MiB/rank": int(mib),
                "mode": "floor (1 copy)",
                "blocked_s": _public(floor),
                "x floor": 1.0,
                "first save s": None,
                "commit_s": None,
            }
        )
        for mode in modes:
            m = size[mode]
            blocked = spread(m["blocked_s"], with_values=True)
            rows.append(
                {
                    "MiB/rank": int(mib),
                    "mode": mode,
                    "blocked_s": _public(blocked),
                    "x floor": blocked["median"] / floor["median"] if floor["median"] > 0 else None,
                    "first save s": m["first_save_s"],
                    "commit_s": _public(spread(m["commit_s"], with_values=True)),
                }
            )
    return rows


def _public(s: dict[str, Any]) -> dict[str, Any]:
    return {k: s[k] for k in ("median", "min", "max", "n")}


def _note(world_size: int, reps: int, device: str) -> str:
    return (
        f"Blocked time per save ({world_size} ranks, gloo, {device}, median (min-max) of {reps} saves after "
        "one warm-up save; per save the slowest rank). floor = one copy of the same state into "
        "preallocated CPU memory. commit_s = save start to checkpoint visible. Local disk, shared 2-core "
        "machine: noisy."
    )


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.ckpt_stall", description=__doc__.split("\n")[0])
    p.add_argument("--mib", type=int, nargs="+", default=[256], help="MiB of state per rank (several ok)")
    p.add_argument("--reps", type=int, default=5, help="timed saves per mode (after one warm-up save)")
    p.add_argument("--world-size", type=int, default=2)
    p.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of " + ",".join(MODES))
    p.add_argument("--dir", type=Path, default=None, help="where to write checkpoints (default: a temp dir)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="cuda: one GPU per rank, NCCL")
    p.add_argument("--quick", action="store_true", help="64 MiB/rank, 3 saves (for make bench --quick)")
    p.add_argument("--out", type=Path, required=True, help="JSON results file")
    args = p.parse_args(argv)
    mib, reps = ([64], 3) if args.quick else (args.mib, args.reps)
    try:
        res = measure(
            mib,
            reps=reps,
            world_size=args.world_size,
            modes=[m for m in args.modes.split(",") if m],
            directory=args.dir,
            device=args.device,
        )
    except ValueError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=2) + "\n")
    for row in res["rows"]:
        b = row["blocked_s"]
        print(
            f"{row['MiB/rank']:>5} MiB/rank {row['mode']:<15} blocked {b['median']:.3f} s "
            f"({b['min']:.3f}-{b['max']:.3f}, n={b['n']})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
