"""The goodput planner section: the default plan, its Monte Carlo check, validation on measured runs."""

from __future__ import annotations

from typing import Any

from bench.report.fmt import md_table


def planner_section(res: dict[str, Any]) -> str:
    """Markdown for the planner figures written by the orchestrator."""
    d = res["default"]
    p = d["plan"]
    snap = d.get("snapshots") or {}
    steps = snap.get("rollback_steps") or {}

    def tier(t: dict[str, Any]) -> str:
        text = f"{t['name']} {100 * t['share']:.1f} % / {t['mttr_s']:g} s / {t['rollback']}"
        if t["name"] in steps:
            rb = steps[t["name"]]
            text += f" ({rb['steps']:g} steps recomputed, {rb['from']}; with the snapshot lag "
            text += f"{t['rollback_s']:.1f} s lost per fault)"
        if t.get("fallback_mttr_s") is not None:
            text += f", {t['fallback_mttr_s']:g} s when the replica is lost"
        return text

    lost = ", ".join(f"{k} {100 * v:.2f} %" for k, v in d["lost"].items())
    text = [
        "### Goodput planner",
        f"`{res['command']}`: {d['gpus']} GPUs at {p['rate_per_gpu_hour']:.3g} faults/GPU-hour (Llama 3 "
        f"405B: job MTBF {d['job_mtbf_h']:.2f} h). Tiers (share of faults / MTTR / rollback; shares from "
        "Llama 3's root causes, MTTRs assumed for a cluster): "
        + "; ".join(tier(t) for t in p["tiers"])
        + f". Durable save stall {p['stall_s']:g} s (assumed).",
        "",
    ]
    if snap.get("every_steps") is not None:
        ratio = snap.get("blocked_over_floor")
        how = snap["from"]
        if ratio is not None:
            how = (
                f"{1e3 * snap['floor_s']:.1f} ms to copy {snap['state_gib_per_gpu']:.2f} GiB per GPU at "
                f"{snap['d2h_gb_s']:g} GB/s, x{ratio:.2f} blocked/floor: {snap['from']}"
            )
        text += [
            f"Snapshots every {snap['every_steps']} steps (the planner's best) of {snap['step_s']:.2f} s, "
            f"each blocking {1e3 * snap['blocked_s']:.1f} ms ({how}). A node loss takes the peer holding its "
            f"replica too in {100 * p['peer_correlated']:.1f} % of cases (an assumed upper bound: every "
            "network switch/cable interruption of Llama 3's), and a peer lost within the "
            f"{p['rereplication_s']:.0f} s re-replication window takes it as well: p = "
            f"{snap['peer_loss_probability']:.4f}; such a node loss rolls back to the durable checkpoint.",
            "",
        ]
    text += [
        f"Expected efficiency **{100 * d['efficiency']:.2f} %** at the optimal checkpoint interval "
        f"{d['interval_optimal_s']:.0f} s (Young/Daly: {d['interval_young_daly_s']:.0f} s); lost: {lost}. "
        f"Checkpoint-restart only (every fault a {d['baseline']['mttr_s']:g} s job restart from the last "
        f"checkpoint, no snapshots): {100 * d['baseline']['efficiency']:.2f} %.",
        "",
    ]
    if res.get("peer_correlated"):
        rows = [
            [f"{100 * r['peer_correlated']:.1f} %", f"{100 * r['efficiency']:.2f} %"]
            for r in res["peer_correlated"]
        ]
        text += [md_table(["node losses that take the replica too", "efficiency"], rows), ""]
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
