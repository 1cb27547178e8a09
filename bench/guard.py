"""The numerical guard's cost per step: the same training steps with the guard on and off.

    python -m bench.guard [--preset tiny] [--steps 20] [--reps 5] [--device cpu] --out results.json

One rank (gloo on CPU, NCCL on CUDA) trains the reference model (FSDP2, AdamW) on random tokens through
the loop's real step check (trainer/runtime/step_check.py `StepCheck`): with the guard on, the optimizer
pre-hook takes the local gradient norm, the rank judges its loss and norm against the windows and the
step's all_reduce carries 4 float64 instead of 1 float32; off, the all_reduce carries the loss alone, as
the loop does without a guard. Each repetition runs `steps` timed steps of each mode (after warm-up
steps), in alternating order, on the same model; a step is the team's forward, backward and optimizer
step plus the check's reduction. Reported: per repetition the median step of each mode and their
difference as a share of the off step; over repetitions the median and range of each (`overhead`), and
the guard's own work timed directly (`parts_s`: the optimizer's step, where its hook takes the norm, and
the reduction, each on minus off), which is what the difference measures on a quiet machine and what
stands out of the noise on a loaded one.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

TARGET = 0.01
"""The issue's target: the guard costs under 1 % of a step."""


def spread(values: Sequence[float]) -> dict[str, Any]:
    vals = sorted(float(v) for v in values)
    return {"median": statistics.median(vals), "min": vals[0], "max": vals[-1], "n": len(vals)}


def _setup(device_name: str) -> Any:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from trainer.runtime.ports import free_port

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    backend = "nccl" if device_name == "cuda" else "gloo"
    device = torch.device("cuda:0" if device_name == "cuda" else "cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend, rank=0, world_size=1)
    return device, init_device_mesh(device.type, (1,))


def _timed_steps(
    model: Any, optim: Any, check: Any, batch: Any, steps: int, device: Any
) -> dict[str, list[float]]:
    """Run `steps` steps through `check`: each step's time, its optimizer step's (where the guard's hook
    runs) and the check's reduction's."""
    import torch
    import torch.nn.functional as F

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    out: dict[str, list[float]] = {"step_s": [], "optim_s": [], "reduce_s": []}
    inputs, targets = batch
    for step in range(steps):
        t0 = time.perf_counter()
        check.begin(step)
        logits = model(inputs)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
        loss.backward()
        sync()
        t1 = time.perf_counter()
        optim.step()
        sync()
        t2 = time.perf_counter()
        optim.zero_grad(set_to_none=True)
        logged = check.faulted_loss(loss.detach())
        check.end()
        t3 = time.perf_counter()
        check.reduce(logged)
        sync()
        t4 = time.perf_counter()
        out["step_s"].append(t4 - t0)
        out["optim_s"].append(t2 - t1)
        out["reduce_s"].append(t4 - t3)
    return out


def run(preset: str, steps: int, reps: int, device_name: str, warmup: int = 3) -> dict[str, Any]:
    import torch

    from trainer.reference.model import PRESETS, build_model
    from trainer.resilience.guard import Guard, GuardConfig, Windows
    from trainer.runtime.faults import FaultInjector
    from trainer.runtime.step_check import StepCheck

    device, mesh = _setup(device_name)
    arch = PRESETS[preset]
    model = build_model(arch, mesh=mesh, device=device, seed=1)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-4)
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, arch.vocab_size, (2, 129), generator=g)
    batch = (tokens[:, :-1].to(device), tokens[:, 1:].to(device))
    faults = FaultInjector([], rank=0, node=0, marker_dir=Path("/nonexistent"), emit=lambda k, s: None)
    per_rep: list[dict[str, Any]] = []
    for rep in range(reps):
        row: dict[str, Any] = {"rep": rep}
        for mode in ("off", "on") if rep % 2 == 0 else ("on", "off"):
            # The window is full after warm-up: the timed steps judge spikes too, as a long run does.
            guard = Guard(GuardConfig(enabled=mode == "on", window=3), Path("/nonexistent"), rank=0)
            check = StepCheck(guard, optim, Windows(3), faults, rank=0, world_size=1, device=device)
            _timed_steps(model, optim, check, batch, warmup, device)
            timed = _timed_steps(model, optim, check, batch, steps, device)
            check.close()
            row[mode] = {k: statistics.median(v) for k, v in timed.items()}
        on, off = row["on"], row["off"]
        row["overhead"] = (on["step_s"] - off["step_s"]) / off["step_s"]
        # The guard's own work: its hook (inside the optimizer's step) and the wider reduction.
        row["parts_s"] = (on["optim_s"] - off["optim_s"]) + (on["reduce_s"] - off["reduce_s"])
        row["parts_share"] = row["parts_s"] / row["off"]["step_s"]
        per_rep.append(row)
        print(
            f"rep {rep}: step off {row['off']['step_s'] * 1e3:.2f} ms, on {row['on']['step_s'] * 1e3:.2f} ms "
            f"({row['overhead']:+.2%}); guard's own work {row['parts_s'] * 1e6:.0f} us "
            f"({row['parts_share']:.3%} of a step)",
            flush=True,
        )
    params = sum(p.numel() for p in model.parameters())
    return {
        "preset": preset,
        "params": params,
        "device": str(device),
        "steps_per_rep": steps,
        "reps": per_rep,
        "step_off_s": spread([r["off"]["step_s"] for r in per_rep]),
        "step_on_s": spread([r["on"]["step_s"] for r in per_rep]),
        "overhead": spread([r["overhead"] for r in per_rep]),
        "parts_s": spread([r["parts_s"] for r in per_rep]),
        "parts_share": spread([r["parts_share"] for r in per_rep]),
        "target": TARGET,
        "meets_target": statistics.median(r["parts_share"] for r in per_rep) < TARGET,
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.guard", description=__doc__.split("\n\n")[0])
    p.add_argument("--preset", default="tiny", help="reference model preset (trainer/reference/model.py)")
    p.add_argument("--steps", type=int, default=20, help="timed steps per mode and repetition")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    if args.steps < 1 or args.reps < 1:
        p.error("--steps and --reps must be >= 1")
    result = run(args.preset, args.steps, args.reps, args.device)
    result["command"] = "python -m bench.guard " + " ".join(sys.argv[1:] if argv is None else argv)
    result["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version(), "load": os.getloadavg()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    o, s = result["overhead"], result["parts_share"]
    print(
        f"guard on vs off: {o['median']:+.2%} per step (range {o['min']:+.2%} .. {o['max']:+.2%}); "
        f"its own work {s['median']:.3%} of a step (range {s['min']:.3%} .. {s['max']:.3%}), "
        f"target < {TARGET:.0%}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
