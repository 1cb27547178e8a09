"""The numerical guard's cost per step: the same training steps with the guard on and off.

    python -m bench.guard [--preset tiny] [--batch 2] [--seq-len 128] [--steps 20] [--reps 5] [--device cpu]
                          --out results.json

One rank (gloo on CPU, NCCL on CUDA) trains the reference model (FSDP2, AdamW) on random tokens through
the loop's real step check (trainer/runtime/step_check.py `StepCheck`): with the guard on, the optimizer
pre-hook takes the local gradient norm, the rank judges its loss and norm against the windows and the
step's all_reduce carries 4 float64 instead of 1 float32; off, the all_reduce carries the loss alone, as
the loop does without a guard. Each repetition runs `steps` timed steps of each mode (after warm-up
steps) on the same model; a step is the team's forward, backward and optimizer step plus the check's
reduction. The modes alternate step by step (each step builds its mode's check and removes its hook
after), so both see the same load on a shared machine. Reported: per repetition the median step of each
mode and their difference as a share of the off step; over repetitions the median and range of each
(`overhead`), and the guard's own work timed directly (`parts_s`: the optimizer's step, where its hook
takes the norm, and the reduction, on minus off, alternating call by call on the same gradients), which
is what the difference measures on a quiet machine and what stands out of the noise on a loaded one.
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
    model: Any, optim: Any, checks: dict[str, Any], batch: Any, steps: int, first: str, device: Any
) -> dict[str, dict[str, list[float]]]:
    """Run `steps` steps of each mode, alternating step by step (`first` leads), so both modes see the
    same load: per mode each step's time, its optimizer step's (where the guard's hook runs) and its
    reduction's. `checks[mode]()` makes that mode's step check (its hook on the optimizer until closed)."""
    import torch
    import torch.nn.functional as F

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize()

    out: dict[str, dict[str, list[float]]] = {
        mode: {"step_s": [], "optim_s": [], "reduce_s": []} for mode in checks
    }
    order = [first, next(m for m in checks if m != first)]
    inputs, targets = batch
    for step in range(2 * steps):
        mode = order[step % 2]
        check = checks[mode]()
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
        check.close()
        out[mode]["step_s"].append(t4 - t0)
        out[mode]["optim_s"].append(t2 - t1)
        out[mode]["reduce_s"].append(t4 - t3)
    return out


def _parts(
    model: Any, optim: Any, checks: dict[str, Any], batch: Any, n: int, device: Any
) -> dict[str, float]:
    """The guard's own work alone, per mode: the optimizer's step (with or without the guard's hook) and
    the reduction, `n` times each on the same gradients, the modes alternating call by call: what the
    whole-step comparison measures, without the forward and backward's noise on a shared machine."""
    import torch
    import torch.nn.functional as F

    inputs, targets = batch
    loss = F.cross_entropy(model(inputs).flatten(0, 1).float(), targets.flatten())
    loss.backward()
    times: dict[str, list[float]] = {mode: [] for mode in checks}
    for i in range(n):
        for mode in checks if i % 2 == 0 else reversed(list(checks)):
            check = checks[mode]()
            check.begin(i)
            t0 = time.perf_counter()
            optim.step()
            logged = check.faulted_loss(loss.detach())
            check.end()
            check.reduce(logged)
            if device.type == "cuda":
                torch.cuda.synchronize()
            times[mode].append(time.perf_counter() - t0)
            check.close()
    optim.zero_grad(set_to_none=True)
    return {mode: statistics.median(t) for mode, t in times.items()}


def run(
    preset: str, steps: int, reps: int, device_name: str, batch: int = 2, seq_len: int = 128, warmup: int = 3
) -> dict[str, Any]:
    """The guard's work is one pass over the rank's gradients (it grows with the parameters per rank); a
    step's grows with the tokens per rank too: `batch` x `seq_len` sets where the share lands."""
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
    tokens = torch.randint(0, arch.vocab_size, (batch, seq_len + 1), generator=g)
    data = (tokens[:, :-1].to(device), tokens[:, 1:].to(device))
    faults = FaultInjector([], rank=0, node=0, marker_dir=Path("/nonexistent"), emit=lambda k, s: None)
    # The "on" window persists across its steps and is full after warm-up: the timed steps judge
    # spikes too, as a long run does.
    guards = {
        mode: Guard(GuardConfig(enabled=mode == "on", window=3), Path("/nonexistent"), rank=0)
        for mode in ("off", "on")
    }
    windows = Windows(3)
    checks = {
        mode: (lambda g=g: StepCheck(g, optim, windows, faults, rank=0, world_size=1, device=device))
        for mode, g in guards.items()
    }
    _timed_steps(model, optim, checks, data, warmup, "on", device)
    per_rep: list[dict[str, Any]] = []
    for rep in range(reps):
        row: dict[str, Any] = {"rep": rep}
        timed = _timed_steps(model, optim, checks, data, steps, "off" if rep % 2 == 0 else "on", device)
        for mode, series in timed.items():
            row[mode] = {k: statistics.median(v) for k, v in series.items()}
        on, off = row["on"], row["off"]
        row["overhead"] = (on["step_s"] - off["step_s"]) / off["step_s"]
        # The guard's own work: its hook (inside the optimizer's step) and the wider reduction.
        row["parts"] = _parts(model, optim, checks, data, 2 * steps, device)
        row["parts_s"] = row["parts"]["on"] - row["parts"]["off"]
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
        "tokens_per_step": batch * seq_len,
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
    p.add_argument("--batch", type=int, default=2, help="sequences per step")
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    if min(args.steps, args.reps, args.batch, args.seq_len) < 1:
        p.error("--steps, --reps, --batch and --seq-len must be >= 1")
    result = run(args.preset, args.steps, args.reps, args.device, args.batch, args.seq_len)
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
