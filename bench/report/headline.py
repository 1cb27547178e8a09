"""The README's short results section: a handful of headline figures, each pointing at its full table.

The whole report (every scenario, phase and size) goes to bench/results/RESULTS.md; a newcomer reading the
README gets one line per thing the blueprint promises, with where it was measured.
"""

from __future__ import annotations

from typing import Any

from bench.report.fmt import fmt_spread, md_table
from bench.report.scale import scale_headline_rows


def _summary(res: dict[str, Any] | None, scenario: str, key: str = "mttr_s") -> dict[str, Any] | None:
    if not res:
        return None
    return (res.get("summary") or {}).get(scenario, {}).get(key)


def _stall_row(stall: dict[str, Any] | None) -> dict[str, Any] | None:
    every = (stall or {}).get("rows", [])
    rows = [r for r in every if r.get("mode") == "nvrx-from-snapshot"]
    rows = rows or [r for r in every if r.get("mode") == "nvrx"]
    return max(rows, key=lambda r: r["MiB/rank"]) if rows else None


def headline_section(
    meta: dict[str, Any] | None,
    rec: dict[str, Any] | None,
    pods: dict[str, Any] | None,
    stall: dict[str, Any] | None,
    plan: dict[str, Any] | None,
    scale: dict[str, Any] | None = None,
) -> str:
    """Markdown: one row per headline figure that the results hold (rows without data are left out)."""
    rows: list[list[str]] = []

    def add(what: str, spread: dict[str, Any] | None, where: str) -> None:
        if spread:
            rows.append([what, fmt_spread(spread), where])

    for what, res, scenario in (
        ("tier 1: an exception, recovered in-process", rec, "exception/tier1"),
        ("tier 2: a rank killed, workers restarted by ft_launcher", rec, "sigkill/tier2"),
        ("a node lost, a hot spare takes its place", pods, "node-loss/spare"),
        ("a node lost, its state restored from a peer's replica", pods, "node-loss/peer"),
        # node 0 (once the rendezvous host) lost, restored from a peer: make bench's pods part runs this one
        ("a node lost (node 0), its state restored from a peer's replica", pods, "host-loss/peer"),
    ):
        add(what, _summary(res, scenario), f"`{scenario}`")
    row = _stall_row(stall)
    if row:
        from_snapshot = row["mode"] == "nvrx-from-snapshot"
        how = "nvrx, written from the step's snapshot" if from_snapshot else "nvrx async"
        what = f"durable checkpoint stall, {row['MiB/rank']} MiB per rank ({how})"
        rows.append([what, fmt_spread(row["blocked_s"]), "checkpoint stall"])
    if plan:
        d = plan["default"]
        rows.append(
            [
                f"planner: expected training efficiency at {d['gpus']:,} GPUs",
                f"{100 * d['efficiency']:.2f} %",
                "goodput planner",
            ]
        )
    rows += scale_headline_rows(scale)  # bench.scale's projections to 2,048 nodes x 8 ranks
    if not rows:
        return "(no benchmark results yet: run `make bench`)\n"
    when = f"`{meta['command']}` on {meta['date']} ({meta['machine']})" if meta else "`make bench`"
    parts = [
        "MTTR = fault to the first training step after it; median (min-max) over the repetitions. CPU ranks "
        f"(gloo, `tiny` preset) on a 2-core machine, from {when}. Every table, its settings and the machine "
        "load: [bench/results/RESULTS.md](bench/results/RESULTS.md).",
        "",
        md_table(["what", "measured", "full table"], rows),
    ]
    unrecorded = [name for name, p in (meta or {}).get("parts", {}).items() if not p.get("load")]
    if unrecorded:
        parts += [
            "",
            "These figures were taken before the benchmarks recorded the machine's load (parts "
            f"{', '.join(unrecorded)}): some figures of that run were taken beside other work. "
            "`make bench` on a quiet machine re-measures them, and now refuses to publish a part that "
            "other work slowed down.",
        ]
    return "\n".join(parts) + "\n"
