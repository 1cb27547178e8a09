"""The synth scaling section: bench.synth's table and plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.report.fmt import as_spread, fmt_spread, md_table
from bench.report.plots import plt, save


def synth_section(res: dict[str, Any]) -> str:
    """Markdown for bench.synth's ``{"synth": [per team count]}``."""
    rows = [
        [
            r["teams"],
            r.get("templates", r["teams"]),
            fmt_spread(as_spread(r["wall_s"], r.get("repeats"))),
            fmt_spread(as_spread(r["cpu_s"], r.get("repeats"))) if r.get("cpu_s") else "-",
            fmt_spread(as_spread(r["tree_peak_rss_mib"], r.get("repeats")), "MiB", 0),
            fmt_spread(as_spread(r["max_process_rss_mib"], r.get("repeats")), "MiB", 0),
            f"{r['cdk_out_mib']:.0f} MiB",
        ]
        for r in res["synth"]
    ]
    via = res["synth"][0].get("via", "cli") if res["synth"] else "cli"
    header = ["teams", "stacks", "wall", "CPU", "peak RSS (process tree)", "largest process", "cdk.out"]
    return "\n".join(
        [
            "### Synth scaling",
            f"`cdk synth` ({via}) of N generated teams, one stack each, fresh folder; median (min-max).",
            "",
            md_table(header, rows),
            "",
        ]
    )


def synth_plot(res: dict[str, Any], png: Path) -> Path | None:
    """Wall time and peak memory against the number of teams."""
    rows = res.get("synth") or []
    if not rows:
        return None
    pyplot = plt()
    fig, ax = pyplot.subplots(figsize=(6.0, 3.4))
    teams = [r["teams"] for r in rows]
    ax.plot(teams, [r["wall_s"]["median"] for r in rows], marker="o", color="#0072b2")
    ax.set_xlabel("teams (stacks)")
    ax.set_ylabel("synth wall time (s)", color="#0072b2")
    ax2 = ax.twinx()
    ax2.plot(teams, [r["tree_peak_rss_mib"]["median"] for r in rows], marker="s", color="#d55e00")
    ax2.set_ylabel("peak RSS (MiB)", color="#d55e00")
    ax.set_title("cdk synth scaling")
    ax.grid(True, alpha=0.3)
    return save(fig, png)
