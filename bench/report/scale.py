"""The scale section: bench.scale's tables, log-log plot, fitted growth and the 2,048-node projection."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.report.fmt import md_table
from bench.report.plots import plt, save

# (table, its title, its columns as (header, field, format))
TABLES: tuple[tuple[str, str, tuple[tuple[str, str, str], ...]], ...] = (
    ("rendezvous", "Rendezvous round (NVRx 0.7 barrier rendezvous, simulated nodes on one TCPStore)", (
        ("nodes", "nodes", "{:.0f}"),
        ("join phase", "join_s", "{:.3f} s"),
        ("host close", "close_s", "{:.4f} s"),
        ("rank reads", "read_s", "{:.3f} s"),
        ("round", "round_s", "{:.2f} s"),
        ("store ops", "store_ops", "{:.0f}"),
        ("host snapshot", "snapshot_bytes", "{:.0f} B"),
    )),
    ("liveness", "Node beats and their watchers, one poll", (
        ("nodes", "nodes", "{:.0f}"),
        ("beats", "beat_s", "{:.3f} s"),
        ("watcher poll", "watcher_poll_s", "{:.3f} s"),
        ("every rank's verdict check", "verdict_checks_s", "{:.3f} s"),
        ("store ops per poll", "store_ops_per_poll", "{:.0f}"),
    )),
    ("restore", "Restore agreement (all_gather of one row per rank)", (
        ("ranks", "ranks", "{:.0f}"),
        ("row", "row_bytes", "{:.0f} B"),
        ("received per rank", "gathered_bytes_per_rank", "{:.0f} B"),
        ("work per rank", "per_rank_work_s", "{:.4f} s"),
    )),
    ("exporter_ranks", "Exporter: a scrape after 10 more steps (one snapshot) against ranks", (
        ("ranks", "ranks", "{:.0f}"),
        ("steps", "steps", "{:.0f}"),
        ("scrape", "scrape_s", "{:.4f} s"),
        ("lines parsed", "scrape_lines", "{:.0f}"),
        ("records held", "held", "{:.0f}"),
        ("former exporter: lines re-parsed", "lines_in_log", "{:.0f}"),
    )),
    ("exporter_steps", "Exporter: a scrape after 10 more steps against the run's length", (
        ("ranks", "ranks", "{:.0f}"),
        ("steps", "steps", "{:.0f}"),
        ("scrape", "scrape_s", "{:.4f} s"),
        ("lines parsed", "scrape_lines", "{:.0f}"),
        ("records held", "held", "{:.0f}"),
        ("former exporter: lines re-parsed", "lines_in_log", "{:.0f}"),
    )),
    ("event_bytes", "Event log: bytes appended to FSx per step per node (snapshot every step)", (
        ("ranks", "ranks", "{:.0f}"),
        ("nodes", "nodes", "{:.0f}"),
        ("now", "bytes_per_step_per_node_now", "{:.0f} B"),
        ("every rank writing", "bytes_per_step_per_node_before", "{:.0f} B"),
        ("appends per step now", "appends_per_step_now", "{:.0f}"),
        ("before", "appends_per_step_before", "{:.0f}"),
    )),
)  # fmt: skip


def _fmt(fmt: str, value: Any) -> str:
    return "-" if value is None else fmt.format(float(value))


def _projected(f: dict[str, Any]) -> str:
    if f["projected"] is None:
        return "-"
    value, unit = float(f["projected"]), f["unit"]
    return f"{value:.3g} {unit}" if unit != "s" else f"{value:.3g} s"


def scale_section(res: dict[str, Any]) -> str:
    """Markdown for bench.scale's result."""
    tables = res.get("tables") or {}
    nodes, per_node = res.get("target_nodes", 2048), res.get("ranks_per_node", 8)
    parts = [
        "### Scale: the control path and the bookkeeping at 2,048 nodes",
        f"`python -m bench.scale --size {res.get('size', '?')}` ({res.get('seconds', 0):.0f} s). Each cost "
        "against the job's size, fitted as y = a x^k on log-log axes (k: the growth exponent), and projected "
        f"to {nodes:,} nodes x {per_node} ranks.",
        "",
    ]
    fits = res.get("fits") or []
    rows = [
        [f["series"], "-" if f["exponent"] is None else f"{f['exponent']:.2f}",
         f"{f['largest_measured']:.0f} {f['x']}" if f.get("largest_measured") else "-",
         f"{f['at']:.0f} {f['x']}", _projected(f)]
        for f in fits
    ]  # fmt: skip
    parts += [md_table(["cost", "exponent k", "largest measured", "projected at", "projection"], rows), ""]
    for name, title, columns in TABLES:
        table = tables.get(name) or []
        if not table:
            continue
        parts += [f"**{title}**", ""]
        parts.append(
            md_table([c[0] for c in columns], [[_fmt(c[2], r.get(c[1])) for c in columns] for r in table])
        )
        parts.append("")
    if res.get("assumptions"):
        parts += ["Assumptions: " + "; ".join(res["assumptions"]) + ".", ""]
    return "\n".join(parts)


def scale_plot(res: dict[str, Any], png: Path) -> Path | None:
    """One log-log panel per table: each series measured (points) and its fit (line)."""
    fits = [f for f in res.get("fits") or [] if f["exponent"] is not None]
    tables = res.get("tables") or {}
    names = [name for name, _, _ in TABLES if any(f["table"] == name for f in fits)]
    if not names:
        return None
    pyplot = plt()
    cols = 3
    rows = (len(names) + cols - 1) // cols
    fig, axes = pyplot.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False)
    for ax, name in zip(axes.flat, names, strict=False):
        for f in (f for f in fits if f["table"] == name):
            xs = [float(r[f["x"]]) for r in tables[name]]
            ys = [float(r[f["y"]]) for r in tables[name]]
            (line,) = ax.plot(xs, ys, "o", label=f"{f['series']} (k={f['exponent']:.2f}, {f['unit']})")
            span = [min(xs), max(max(xs), float(f["at"]))]
            ax.plot(
                span, [f["a"] * x ** f["exponent"] for x in span], "--", color=line.get_color(), alpha=0.6
            )
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(name.replace("_", " "), fontsize=9)
        ax.legend(fontsize=6)
        ax.grid(True, which="both", alpha=0.3)
    for ax in list(axes.flat)[len(names) :]:
        ax.set_visible(False)
    return save(fig, png)


HEADLINE = (  # series projected to 2,048 nodes that the README's headline shows
    ("rendezvous round at 2,048 nodes (projected)", "rendezvous round (store work + polls)"),
    ("exporter scrape at 16,384 ranks (projected)", "exporter scrape (10 steps appended) vs ranks"),
    ("event log: bytes per step per node (any size)", "event bytes per step per node vs ranks"),
)


def scale_headline_rows(res: dict[str, Any] | None) -> list[list[str]]:
    """README headline rows: the projections to 2,048 nodes (bench.scale, assumptions in RESULTS.md)."""
    by = {f["series"]: f for f in (res or {}).get("fits") or []}
    rows = []
    for what, series in HEADLINE:
        f = by.get(series)
        if f and f["projected"] is not None:
            rows.append([what, f"{_projected(f)} (k={f['exponent']:.2f})", "scale"])
    return rows
