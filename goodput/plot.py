"""The scale plot: expected efficiency vs cluster size, configured tiers vs checkpoint-restart only."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from goodput.model import DEFAULT_SCALES, Plan, scale_sweep


def plot_scale(plan: Plan, baseline: Plan, path: Path, scales: Sequence[int] = DEFAULT_SCALES) -> None:
    """PNG of efficiency (at each size's optimal interval) vs GPUs, tiers vs the baseline."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for label, p in (("configured tiers", plan), ("checkpoint-restart only", baseline)):
        rows = scale_sweep(p, scales)
        ax.plot([r["gpus"] for r in rows], [100 * r["efficiency"] for r in rows], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(scales), [str(g) for g in scales], rotation=45)
    ax.minorticks_off()
    ax.set_xlabel("GPUs")
    ax.set_ylabel("expected training efficiency (%)")
    ax.set_title(f"{plan.rate_per_gpu_hour:.2g} faults/GPU-h, stall {plan.stall_s:g} s, optimal interval")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
