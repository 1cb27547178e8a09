"""Turn the benchmark JSON under bench/results/ into markdown tables, PNG plots and the README section.

Reads whatever results exist (recovery.json, ckpt_stall.json, synth.json, planner.json), writes
``bench/results/RESULTS.md`` and the plots next to it, and replaces the text between
``<!-- bench:results:start -->`` and ``<!-- bench:results:end -->`` in README.md - nothing else there.

    python -m bench.report [--results bench/results] [--readme README.md]
"""

from __future__ import annotations

import argparse
import json
import math
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

START = "<!-- bench:results:start -->"
END = "<!-- bench:results:end -->"
REPO = Path(__file__).resolve().parent.parent


def _load(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.is_file() else None


def fmt_spread(s: dict[str, float] | None, unit: str = "s", digits: int = 2) -> str:
    """``median (min-max)`` of a spread dict, or a dash."""
    if not s:
        return "-"
    med, lo, hi = (f"{float(s[k]):.{digits}f}" for k in ("median", "min", "max"))
    sep = " " if unit else ""
    return f"{med}{sep}{unit} ({lo}-{hi})" if s.get("n", 1) > 1 else f"{med}{sep}{unit}"


def md_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub markdown table."""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


# ----------------------------------------------------------------------------- recovery
def recovery_section(res: dict[str, Any]) -> str:
    """Markdown for bench.recovery's result."""
    cfg = res["config"]
    rows = []
    for name, s in res["summary"].items():
        by = Counter(detector(r.get("detected_by")) for r in res.get("runs", []) if r["scenario"] == name)
        rows.append(
            [
                f"`{name}`",
                f"{s['ok']}/{s['runs']}",
                str(s.get("unplanned_restarts", "-")),
                ", ".join(k for k, _ in by.most_common()) or "-",
                fmt_spread(s.get("detection_s")),
                fmt_spread(s.get("mttr_s")),
                fmt_spread(s.get("regain_s")),
                fmt_spread(s.get("steps_recomputed"), "", 0),
                fmt_spread(s.get("load_s"), "s", 3),
            ]
        )
    header = [
        "scenario",
        "ok",
        "unplanned restarts",
        "detected by",
        "detection",
        "MTTR",
        "back at the fault step",
        "steps recomputed",
        "load",
    ]
    text = [
        "### Recovery",
        f"One local pod of {cfg['nproc']} CPU ranks (`{cfg['preset']}` preset, gloo), one fault at step "
        f"{cfg['fault_step']} of {cfg['steps']} on rank 1, checkpoint every {cfg['ckpt_interval']} steps; "
        f"{res['reps']} repetition(s) each, median (min-max). Timeouts: collective "
        f"{cfg['collective_timeout']:g} s, in-process soft {cfg['inprocess_soft_timeout']:g} s, heartbeat "
        f"{cfg['heartbeat_timeout']:g} s. *MTTR*: fault -> start of the first step after it; *back at the "
        "fault step*: MTTR plus the recompute from the restored checkpoint. A full restart relaunches "
        "the whole pod with the node-local checkpoints deleted, as on new nodes; it includes no "
        "scheduling or node replacement. *detected by*: what noticed the fault first (a hang is noticed "
        "by the healthy peer's collective timeout, before the Wrapper's soft timeout or the launcher's "
        "heartbeat timeout). *unplanned restarts*: recoveries nobody injected, over all runs of the "
        "scenario (a collective that timed out with no fault; tier 1 recovered them).",
        "",
        md_table(header, rows),
        "",
    ]
    phases = {n: s["phases"] for n, s in res["summary"].items() if s.get("phases")}
    if phases:
        keys = list(next(iter(phases.values())))
        text += [
            "Median phases (s): detect -> restart (process or iteration up) -> init (process group, "
            "model) -> load -> first step.",
            "",
            md_table(
                ["scenario", *keys], [[f"`{n}`", *(f"{p[k]:.2f}" for k in keys)] for n, p in phases.items()]
            ),
            "",
        ]
    return "\n".join(text)


PHASE_COLOURS = {
    "detect": "#d55e00",
    "restart": "#e69f00",
    "init": "#56b4e9",
    "load": "#009e73",
    "first_step": "#cc79a7",
}


def detector(detected_by: str | None) -> str:
    """A short name for what noticed the fault, from bench.recovery's ``detected_by``."""
    text = detected_by or ""
    if text.startswith("pod exit"):
        return "job controller (pod exit)"
    if text.startswith("ft_launcher"):
        return "ft_launcher (worker exit)"
    if text.startswith("tier 1"):
        for needle, why in (
            ("Timed out", "collective timeout"),
            ("Connection closed", "peer closed"),
            ("InjectedFault", "the exception"),
            ("Interruption.EXCEPTION", "a rank raised"),
            ("timeout", "soft/hard timeout"),
        ):
            if needle in text:
                return f"Wrapper ({why})"
        return "Wrapper"
    if text.startswith("tier 2"):
        return "Wrapper, hands over to tier 2" if "LeaveToTier2" in text else "SIGTERM from ft_launcher"
    return "-"


def recovery_plot(res: dict[str, Any], png: Path) -> Path | None:
    """MTTR per scenario as stacked median phases, with the MTTR's min-max as whiskers."""
    items = [(n, s) for n, s in res["summary"].items() if s.get("mttr_s")]
    if not items:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(7.5, 0.6 * len(items) + 1.6))
    names = [n for n, _ in items]
    left = [0.0] * len(items)
    for phase, colour in PHASE_COLOURS.items():
        widths = [float((s.get("phases") or {}).get(phase, 0.0)) for _, s in items]
        ax.barh(names, widths, left=left, color=colour, label=phase)
        left = [lo + w for lo, w in zip(left, widths, strict=True)]
    meds = [float(s["mttr_s"]["median"]) for _, s in items]
    lo = [m - float(s["mttr_s"]["min"]) for m, (_, s) in zip(meds, items, strict=True)]
    hi = [float(s["mttr_s"]["max"]) - m for m, (_, s) in zip(meds, items, strict=True)]
    ax.errorbar(meds, names, xerr=[lo, hi], fmt="|", color="black", capsize=3, label="MTTR min-max")
    ax.invert_yaxis()
    ax.set_xlabel("fault -> first step after it (s): median phases")
    ax.set_title(f"Recovery on CPU ({res['config']['nproc']} ranks, gloo), {res['reps']} run(s) each")
    ax.grid(True, axis="x", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    return _save(fig, png)


# ----------------------------------------------------------------------------- planner
def planner_section(res: dict[str, Any]) -> str:
    """Markdown for the planner figures written by the orchestrator."""
    d = res["default"]
    p = d["plan"]
    tiers = ", ".join(
        f"{t['name']} {100 * t['share']:.0f} % / {t['mttr_s']:g} s / {t['rollback']}" for t in p["tiers"]
    )
    lost = ", ".join(f"{k} {100 * v:.2f} %" for k, v in d["lost"].items())
    text = [
        "### Goodput planner",
        f"`{res['command']}`: {d['gpus']} GPUs at {p['rate_per_gpu_hour']:.3g} faults/GPU-hour "
        f"(job MTBF {d['job_mtbf_h']:.2f} h); tiers (share / MTTR / rollback): {tiers}; stall "
        f"{p['stall_s']:g} s. Expected efficiency **{100 * d['efficiency']:.2f} %** at the optimal interval "
        f"{d['interval_optimal_s']:.0f} s (Young/Daly: {d['interval_young_daly_s']:.0f} s); lost: {lost}. "
        f"Checkpoint-restart only (every fault a {d['baseline']['mttr_s']:g} s job restart): "
        f"{100 * d['baseline']['efficiency']:.2f} %. The tier MTTRs are assumptions for a cluster, not "
        "measurements.",
        "",
    ]
    if res.get("montecarlo"):
        rows = [
            [
                r["case"],
                f"{100 * r['model']:.2f} %",
                f"{100 * r['simulated']:.2f} %",
                f"{100 * r['stderr']:.2f}",
                f"{100 * (r['simulated'] - r['model']):+.2f}",
            ]
            for r in res["montecarlo"]
        ]
        text += [
            "Closed form vs Monte Carlo of the same model (seeded):",
            "",
            md_table(["case", "model", "simulated", "std. error (pp)", "difference (pp)"], rows),
            "",
        ]
    if res.get("measured"):
        m = res["measured"]
        text += [
            f"The same plan with the MTTRs measured above ({m['note']}: "
            + ", ".join(f"{t['name']} {t['mttr_s']:.1f} s" for t in m["tiers"])
            + f"): {100 * m['efficiency']:.2f} % at {m['gpus']} GPUs - what the tiers would give if a "
            "cluster recovered as fast as this CPU pod (it does not: scheduling, node replacement and "
            "NCCL/EFA start-up add minutes).",
            "",
        ]
    if res.get("recovery_runs"):
        runs = res["recovery_runs"]
        diffs = sorted(abs(float(r["difference_pp"])) for r in runs)
        text += [
            f"Validation on the {len(runs)} recovery runs above without unplanned restarts: the planner, "
            "fed each run's own measured step time, stall, fault rate, tier and MTTR (plus its measured "
            "start-up and tail, which the model does not cover), predicts its training efficiency within "
            f"{diffs[len(diffs) // 2]:.1f} pp (median) and {diffs[-1]:.1f} pp (worst). These runs have one "
            "fault each, so the recompute is one draw, not the model's average.",
            "",
            md_table(
                ["scenario", "run", "measured", "predicted", "difference (pp)"],
                [
                    [
                        f"`{r['scenario']}`",
                        r["rep"],
                        f"{100 * float(r['measured']):.1f} %",
                        f"{100 * r['predicted']:.1f} %",
                        f"{r['difference_pp']:+.1f}",
                    ]
                    for r in runs
                ],
            ),
            "",
        ]
    if res.get("demo"):
        demo = res["demo"]
        text += [
            f"Demo run (`{demo['path']}`): measured {100 * float(demo['measured_efficiency']):.2f} %, "
            f"predicted from its own parameters {100 * demo['predicted_efficiency']:.2f} % "
            f"({demo['difference_pp']:+.2f} pp).",
            "",
        ]
    if res.get("scale_png"):
        text += [f"![efficiency vs cluster size]({res['scale_png']})", ""]
    return "\n".join(text)


# ----------------------------------------------------------------------------- synth (bench.synth)
def synth_section(res: dict[str, Any]) -> str:
    """Markdown for bench.synth's ``{"synth": [per team count]}``."""
    rows = [
        [
            r["teams"],
            r.get("templates", r["teams"]),
            fmt_spread(_as_spread(r["wall_s"], r.get("repeats"))),
            fmt_spread(_as_spread(r["cpu_s"], r.get("repeats"))) if r.get("cpu_s") else "-",
            fmt_spread(_as_spread(r["tree_peak_rss_mib"], r.get("repeats")), "MiB", 0),
            fmt_spread(_as_spread(r["max_process_rss_mib"], r.get("repeats")), "MiB", 0),
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
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6.0, 3.4))
    teams = [r["teams"] for r in rows]
    ax.plot(teams, [r["wall_s"]["median"] for r in rows], marker="o", color="#0072b2")
    ax.set_xlabel("teams (stacks)")
    ax.set_ylabel("synth wall time (s)", color="#0072b2")
    ax2 = ax.twinx()
    ax2.plot(teams, [r["tree_peak_rss_mib"]["median"] for r in rows], marker="s", color="#d55e00")
    ax2.set_ylabel("peak RSS (MiB)", color="#d55e00")
    ax.set_title("cdk synth scaling")
    ax.grid(True, alpha=0.3)
    return _save(fig, png)


def _as_spread(s: dict[str, Any], n: int | None) -> dict[str, Any]:
    return {"median": s["median"], "min": s["min"], "max": s["max"], "n": n or len(s.get("runs", [1]))}


# ----------------------------------------------------------------------------- other engineers' benches
def rows_section(title: str, res: dict[str, Any]) -> str:
    """Markdown for a result that carries ``rows`` (a list of flat dicts) and optional ``note``."""
    rows = res.get("rows") or []
    if not rows:
        return f"### {title}\n\n(no rows)\n"
    header = list(rows[0])
    body = [[_cell(r.get(h)) for h in header] for r in rows]
    text = [f"### {title}"]
    if res.get("note"):
        text.append(str(res["note"]))
    text += ["", md_table(header, body), ""]
    return "\n".join(text)


def _cell(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3g}" if math.isfinite(v) else str(v)
    if isinstance(v, dict) and "median" in v:
        return fmt_spread(v, "", 3).strip()
    return "-" if v is None else str(v)


# ----------------------------------------------------------------------------- assembly
def build(results: Path) -> str:
    """The whole results markdown from what exists under ``results``."""
    parts = []
    meta = _load(results / "meta.json")
    if meta:
        took = ", ".join(
            f"{name} {p['seconds'] / 60:.1f} min" + ("" if p.get("ok") else " (FAILED)")
            for name, p in meta["parts"].items()
        )
        parts.append(
            f"Generated by `{meta['command']}` on {meta['date']} ({meta['machine']}); total "
            f"{meta['total_s'] / 60:.1f} min ({took}). Timings come from a 2-core machine shared with other "
            "work: medians with min-max."
        )
        parts.append("")
    rec = _load(results / "recovery.json")
    if rec:
        parts.append(recovery_section(rec))
        if recovery_plot(rec, results / "recovery.png"):
            parts += ["![recovery](bench/results/recovery.png)", ""]
    stall = _load(results / "ckpt_stall.json")
    if stall:
        parts.append(rows_section("Checkpoint stall", stall))
        parts += [f"![checkpoint stall]({png})\n" for png in stall.get("plots") or []]
    synth = _load(results / "synth.json")
    if synth:
        parts.append(synth_section(synth))
        if synth_plot(synth, results / "synth.png"):
            parts += ["![synth](bench/results/synth.png)", ""]
    plan = _load(results / "planner.json")
    if plan:
        parts.append(planner_section(plan))
    if not parts:
        return "(no benchmark results yet: run `make bench`)\n"
    return "\n".join(parts).rstrip() + "\n"


def replace_between_markers(text: str, body: str) -> str:
    """``text`` with everything between the bench markers replaced by ``body``."""
    start, end = text.find(START), text.find(END)
    if start < 0 or end < 0 or end < start:
        raise ValueError(f"README: markers {START} ... {END} not found in order")
    return text[: start + len(START)] + "\n" + body + text[end:]


def write(results: Path, readme: Path | None) -> str:
    """Write RESULTS.md (and the README section when ``readme`` is given); returns the markdown."""
    body = build(results)
    results.mkdir(parents=True, exist_ok=True)
    # RESULTS.md sits next to the plots; the README links them from the repository root.
    (results / "RESULTS.md").write_text("# Benchmark results\n\n" + body.replace("](bench/results/", "]("))
    if readme is not None:
        readme.write_text(replace_between_markers(readme.read_text(), body))
    return body


def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig: Any, png: Path) -> Path:
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(png, dpi=120)
    _plt().close(fig)
    return png


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.report", description=__doc__.split("\n")[0])
    p.add_argument("--results", type=Path, default=REPO / "bench" / "results")
    p.add_argument("--readme", type=Path, default=REPO / "README.md")
    p.add_argument("--no-readme", action="store_true", help="write RESULTS.md only")
    args = p.parse_args(argv)
    write(args.results, None if args.no_readme else args.readme)
    print(f"wrote {args.results / 'RESULTS.md'}" + ("" if args.no_readme else f" and {args.readme}"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
