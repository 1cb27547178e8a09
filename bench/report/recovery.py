"""The recovery section: bench.recovery's table, what detected each fault, the phase plot."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from bench.report.fmt import fmt_spread, md_table
from bench.report.plots import plt, save


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
    pyplot = plt()
    fig, ax = pyplot.subplots(figsize=(7.5, 0.6 * len(items) + 1.6))
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
    return save(fig, png)
