"""Draw a run's timeline (productive steps, recomputed steps, checkpoints, faults, recoveries) as a PNG,
over the live goodput curve a collector scraping the trainer would have recorded.

Reads the trainer's event files (Contract 3 in docs/design.md) through trainer.events.metrics; the curve is
the exporter's own `trainer_goodput_ratio` (trainer/events/metrics_export.py) replayed at each scrape time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # headless: the demo runs on machines with no display
import matplotlib.pyplot as plt
from matplotlib.patches import Patch

from trainer.events.metrics import read_events, summarize_events
from trainer.events.metrics_export import live_goodput

TIER_COLOURS = {1: "#e69f00", 2: "#d55e00"}
SCRAPE_S = 1.0  # the replayed scrape interval (a cluster collector scrapes every 30 s)


def goodput_curve(events: list[dict[str, Any]], scrape_s: float = SCRAPE_S) -> list[tuple[float, float]]:
    """(time, trainer_goodput_ratio) at every scrape from the first to the last event: what the exporter
    would have served then, from the events written by then."""
    if not events:
        return []
    t0, t_end = float(events[0]["t"]), float(events[-1]["t"])
    curve: list[tuple[float, float]] = []
    k, now = 0, t0 + scrape_s
    while True:
        now = min(now, t_end)
        while k < len(events) and float(events[k]["t"]) <= now:
            k += 1
        value = live_goodput(summarize_events(events[:k]), t0, now)
        if value is not None:
            curve.append((now, value))
        if now >= t_end:
            return curve
        now += scrape_s


def draw(out_dir: Path, summary: dict[str, Any], png: Path) -> Path:
    events, _ = read_events(out_dir)
    if not events:
        raise ValueError(f"no events under {out_dir}")
    t0 = min(e["t"] for e in events)
    steps = [e for e in events if e["ev"] == "step"]
    # The last run of a step number is the one whose result was kept; earlier runs were recomputed.
    kept: dict[int, dict[str, Any]] = {}
    for e in steps:
        kept[e["step"]] = e
    kept_ids = {id(e) for e in kept.values()}

    fig, (ax, gax) = plt.subplots(
        2, 1, figsize=(12, 5.4), sharex=True, gridspec_kw={"height_ratios": [3.2, 2.2]}
    )
    for e in steps:
        colour = "#009e73" if id(e) in kept_ids else "#999999"
        ax.broken_barh([(e["t_start"] - t0, e["t_end"] - e["t_start"])], (2.0, 0.8), color=colour)
    for e in events:
        if e["ev"] == "ckpt_save" and e.get("rank", 0) == 0:
            ax.broken_barh(
                [(e["t"] - e["blocked_s"] - t0, max(e["blocked_s"], 0.05))], (1.0, 0.8), color="#0072b2"
            )
        if e["ev"] == "snapshot" and e.get("rank", 0) == 0:
            ax.broken_barh(
                [(e["t"] - e["blocked_s"] - t0, max(e["blocked_s"], 0.02))], (0.7, 0.25), color="#56b4e9"
            )
        if e["ev"] == "ckpt_commit":
            ax.plot(e["t"] - t0, 1.4, marker="|", color="#0072b2", markersize=14)
    for fault in summary.get("faults", []):
        t_fault = fault["t"] - t0
        colour = TIER_COLOURS.get(fault.get("tier"), "#cc0000")
        ax.axvline(t_fault, color=colour, linestyle="--", linewidth=1.2)
        if fault.get("mttr_s") is not None:
            ax.axvspan(t_fault, t_fault + fault["mttr_s"], color=colour, alpha=0.2)
        label = f"{fault['type']} (tier {fault.get('tier', '?')})"
        if fault.get("mttr_s") is not None:
            label += f"\nrecovered in {fault['mttr_s']:.1f} s"
        ax.text(t_fault, 3.05, label, fontsize=8, color=colour, va="bottom")
    loss = summary.get("loss_s") or {}
    wall = float(summary.get("wall_s") or 0.0)
    if loss and wall > 0:  # the same terms as summary.json's loss_s and the report
        parts = [("startup", loss.get("startup", 0.0)), ("recovery", sum(loss.get("recovery") or []))]
        terms = ("recompute", "ckpt_stall", "snapshot_stall", "tail", "straggler", "eviction", "other")
        parts += [(k, loss.get(k, 0.0)) for k in terms]
        text = "lost: " + ", ".join(f"{k} {100 * v / wall:.1f}%" for k, v in parts)
        ax.text(0, 3.55, text, fontsize=7.5, color="#333333", va="bottom")
    ax.set_yticks([0.82, 1.4, 2.4], ["snapshot", "checkpoint", "training"])
    ax.set_ylim(0.5, 3.9)
    curve = goodput_curve(events)
    gax.plot([t - t0 for t, _ in curve], [v * 100 for _, v in curve], color="#009e73", linewidth=1.6)
    final = summary.get("training_efficiency")
    if final is not None:
        gax.axhline(final * 100, color="#555555", linestyle=":", linewidth=1)
        gax.text(0, final * 100 + 2, f"summary.json: {final:.1%}", fontsize=8, color="#555555")
    for fault in summary.get("faults", []):
        gax.axvline(fault["t"] - t0, color=TIER_COLOURS.get(fault.get("tier"), "#cc0000"), linestyle="--")
    gax.set_ylim(0, 100)
    gax.set_ylabel("live goodput (%)")
    gax.set_title(
        f"trainer_goodput_ratio as a collector scraping every {SCRAPE_S:g} s records it",
        fontsize=9,
        loc="left",
    )
    gax.set_xlabel("wall time since start (s)")
    efficiency = summary.get("training_efficiency")
    title = "Smoke run timeline"
    if efficiency is not None:
        title += f": training efficiency {efficiency:.1%}"
    ax.set_title(title)
    ax.legend(
        handles=[
            Patch(color="#009e73", label="productive step"),
            Patch(color="#999999", label="recomputed step"),
            Patch(color="#0072b2", label="checkpoint stall / commit"),
            Patch(color="#56b4e9", label="snapshot stall"),
            Patch(color=TIER_COLOURS[1], alpha=0.4, label="tier-1 recovery"),
            Patch(color=TIER_COLOURS[2], alpha=0.4, label="tier-2 recovery"),
        ],
        loc="upper left",
        bbox_to_anchor=(1.0, 1.0),
        fontsize=8,
    )
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=120)
    plt.close(fig)
    return png
