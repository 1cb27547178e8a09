"""The section of bench.recovery_pods: a lost node with and without a hot spare, and compound faults, beside
the one-pod figures of bench.recovery."""

from __future__ import annotations

from typing import Any

from bench.report.fmt import fmt_spread, md_table

# The one-pod scenario of bench.recovery each multi-pod scenario compares with (today's numbers).
BESIDE = {
    "node-loss/spare": "sigkill/tier2",
    "node-loss/no-spare": "sigkill/tier2",
    "compound/rank-during-restart": "sigkill/tier2",
    "compound/spare-during-join": "sigkill/tier2",
    "compound/spare-during-join/2-spares": "sigkill/tier2",
    "compound/monitors-then-rank": "sigkill/tier2",
}


def pods_section(res: dict[str, Any], one_pod: dict[str, Any] | None) -> str:
    """Markdown for bench.recovery_pods' result; `one_pod`: bench.recovery's, for the comparison column."""
    cfg = res["config"]
    base = (one_pod or {}).get("summary") or {}
    loads = [float(r["load_avg_1min"]) for r in res.get("runs", []) if r.get("load_avg_1min") is not None]
    load = (
        f"The machine's 1-minute load average at the start of these runs: {min(loads):.1f}-{max(loads):.1f} "
        "(2 cores; every figure here grows with it, the one-pod column was measured on another day)."
        if loads
        else "The one-pod column was measured on another day, under another load."
    )
    rows = []
    for name, s in res["summary"].items():
        beside = BESIDE.get(name)
        ref = base.get(beside or "", {}).get("mttr_s")
        phases = s.get("phases") or {}
        rows.append(
            [
                f"`{name}`",
                f"{s['ok']}/{s['runs']}",
                fmt_spread(s.get("mttr_s")),
                fmt_spread(s.get("single_mttr_s")),
                fmt_spread(s.get("compound_over_single"), "x"),
                ", ".join(t for t in s.get("takeovers") or [] if t != "None") or "-",
                fmt_spread(s.get("linger_s")),
                " / ".join(f"{(phases.get(k) or {}).get('median', 0.0):.1f}" for k in _PHASES)
                if phases
                else "-",
                f"{fmt_spread(ref)} (`{beside}`)" if ref else "-",
            ]
        )
    header = [
        "scenario",
        "ok",
        "MTTR (last fault)",
        "single fault, same run",
        "compound / single",
        "spare that took over",
        "last pod gone after the first finished",
        "detect / notice / rendezvous / start / restore / first step (s)",
        "one pod, today (bench.recovery)",
    ]
    text = [
        "### Recovery across pods: node loss, hot spares, compound faults",
        f"`python -m bench.recovery_pods`: several local pods of the chart's pod command, 1 CPU rank each "
        f"(2 for the one-pod compound faults), {cfg['steps']} steps, checkpoint every "
        f"{cfg['ckpt_interval']}; "
        f"a lost pod's replacement starts {cfg['replace_delay_s']:g} s after it died (a new EKS node takes "
        f"minutes); `rdzvLastCallTimeout` {cfg['last_call_s']}, Wrapper liveness timeout "
        f"{cfg['liveness_s']:g} s; {res['reps']} repetition(s), median (min-max). *MTTR*: fault -> first "
        "step after it. A compound scenario's first fault is its single fault, measured in the same run. "
        "*ok*: completed, every fault recovered, no pod replaced that nobody killed (no whole-job "
        "restart). The phases are tools/recovery_phases.py's, for the last fault. " + load,
        "",
        md_table(header, rows),
        "",
    ]
    return "\n".join(text)


_PHASES = ("detect", "notice", "rendezvous", "start", "restore", "first_step")
