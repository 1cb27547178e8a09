"""The planner's command line: ``python -m goodput`` (text or JSON; ``--summary`` predicts a run)."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from goodput.fit import predict_from_summary, with_measured_mttrs
from goodput.model import (
    Plan,
    PlanError,
    Tier,
    checkpoint_restart_baseline,
    evaluate,
    optimal_interval,
    plan_dict,
    plan_from_dict,
    young_daly_interval,
)
from goodput.plot import plot_scale
from goodput.profiles import PROFILES

DESCRIPTION = (
    "Goodput planner: expected training efficiency and the best checkpoint interval at cluster scale."
)

DEFAULT_TIERS = (
    # Illustrative shares and MTTRs; pass --tier (or --measured) for your own. This trainer's tier 1
    # rebuilds the model and reloads the newest checkpoint (node-local first), so it rolls back too;
    # rollback=memory models a tier that keeps the training state in memory.
    "in-process:share=0.3:mttr=30:rollback=checkpoint",
    "in-job:share=0.5:mttr=120:rollback=checkpoint",
    "job-restart:share=0.2:mttr=900:rollback=checkpoint",
)


def parse_tier(spec: str) -> Tier:
    """Parse ``NAME:share=S:mttr=SECONDS[:rollback=checkpoint|memory]``."""
    name, *parts = spec.split(":")
    fields: dict[str, str] = {}
    for part in parts:
        key, sep, value = part.partition("=")
        if not sep or key not in ("share", "mttr", "rollback"):
            raise PlanError(
                f"--tier {spec!r}: expected NAME:share=S:mttr=SECONDS[:rollback=...], got {part!r}"
            )
        fields[key] = value
    for key in ("share", "mttr"):
        if key not in fields:
            raise PlanError(f"--tier {spec!r}: missing {key}=")
    try:
        share, mttr = float(fields["share"]), float(fields["mttr"])
    except ValueError as err:
        raise PlanError(f"--tier {spec!r}: share and mttr must be numbers") from err
    return Tier(name, share, mttr, fields.get("rollback", "checkpoint"))  # type: ignore[arg-type]


def _rate(args: argparse.Namespace) -> float:
    if args.rate_per_gpu_hour is not None:
        return float(args.rate_per_gpu_hour)
    if args.profile not in PROFILES:
        raise PlanError(f"--profile must be one of {sorted(PROFILES)}, got {args.profile!r}")
    return PROFILES[args.profile][0]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m goodput", description=DESCRIPTION)
    p.add_argument("--nodes", type=int, default=2048, help="nodes in the job (default 2048)")
    p.add_argument("--gpus-per-node", type=int, default=8, help="GPUs per node (default 8)")
    rate = p.add_mutually_exclusive_group()
    rate.add_argument(
        "--profile", default="llama3-405b", help=f"named failure rate, one of {sorted(PROFILES)}"
    )
    rate.add_argument("--rate-per-gpu-hour", type=float, default=None, help="faults per GPU-hour")
    p.add_argument(
        "--tier", action="append", default=None, help="NAME:share=S:mttr=SEC[:rollback=checkpoint|memory]"
    )
    p.add_argument(
        "--measured",
        type=Path,
        default=None,
        help="take tier MTTRs from this bench.recovery result (bench/results/recovery.json)",
    )
    p.add_argument("--stall", type=float, default=10.0, help="seconds blocked per checkpoint save")
    p.add_argument("--interval", type=float, default=None, help="seconds between saves (default: optimal)")
    p.add_argument(
        "--baseline-mttr",
        type=float,
        default=None,
        help="MTTR of a full job restart (default: the largest tier MTTR)",
    )
    p.add_argument("--baseline-stall", type=float, default=None, help="stall of the baseline's saves")
    p.add_argument("--summary", type=Path, default=None, help="predict this run's summary.json instead")
    p.add_argument("--plot", type=Path, default=None, help="write efficiency vs cluster size to this PNG")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    return p


def run_plan(args: argparse.Namespace) -> dict[str, Any]:
    """Everything the CLI prints, as a dict."""
    tiers = tuple(parse_tier(s) for s in (args.tier or DEFAULT_TIERS))
    if args.measured is not None:
        tiers = with_measured_mttrs(tiers, json.loads(args.measured.read_text()))
    plan = Plan(args.nodes, args.gpus_per_node, _rate(args), tiers, args.stall, args.interval or 1.0)
    exact = optimal_interval(plan)
    if args.interval is None:
        plan = plan.with_(interval_s=exact if math.isfinite(exact) and exact > 0 else 3600.0)
    out = evaluate(plan)
    base_mttr = args.baseline_mttr if args.baseline_mttr is not None else max(t.mttr_s for t in tiers)
    base = checkpoint_restart_baseline(plan, base_mttr, args.baseline_stall)
    base_opt = optimal_interval(base)
    base_out = evaluate(base, base_opt if math.isfinite(base_opt) and base_opt > 0 else plan.interval_s)
    return {
        "plan": plan_dict(plan),
        "gpus": plan.gpus,
        "job_mtbf_h": math.inf if plan.fault_rate_s == 0 else 1 / plan.fault_rate_s / 3600,
        "efficiency": out.efficiency,
        "lost": out.lost(),
        "faults_per_running_day": plan.fault_rate_s * 86400,
        "interval_optimal_s": exact,
        "interval_young_daly_s": young_daly_interval(plan),
        "efficiency_at_optimal": evaluate(plan, exact).efficiency
        if math.isfinite(exact) and exact > 0
        else out.efficiency,
        "baseline": {
            "mttr_s": base_mttr,
            "stall_s": base.stall_s,
            "interval_s": base_opt,
            "efficiency": base_out.efficiency,
        },
    }


def format_text(r: dict[str, Any]) -> str:
    """A human-readable report of ``run_plan``'s result."""
    plan = r["plan"]
    lines = [
        f"cluster            {r['gpus']} GPUs ({plan['nodes']} x {plan['gpus_per_node']}), "
        f"{plan['rate_per_gpu_hour']:.3g} faults/GPU-h -> job MTBF {r['job_mtbf_h']:.3g} h",
        f"checkpoint         stall {plan['stall_s']:.3g} s every {plan['interval_s']:.0f} s",
        f"efficiency         {100 * r['efficiency']:.2f} %",
        f"optimal interval   exact {r['interval_optimal_s']:.0f} s "
        f"({100 * r['efficiency_at_optimal']:.2f} %), Young/Daly {r['interval_young_daly_s']:.0f} s",
        "lost time (% of wall):",
    ]
    lines += [f"  {k:<24} {100 * v:6.2f}" for k, v in r["lost"].items()]
    b = r["baseline"]
    lines.append(
        f"baseline           checkpoint-restart only (MTTR {b['mttr_s']:.0f} s, stall {b['stall_s']:.3g} s, "
        f"interval {b['interval_s']:.0f} s): {100 * b['efficiency']:.2f} %"
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.summary is not None:
            result = predict_from_summary(args.summary, args.interval)
            print(json.dumps(result, indent=2) if args.json else _format_prediction(result))
            return 0
        result = run_plan(args)
        if args.plot is not None:
            plan = plan_from_dict(result["plan"])
            base = checkpoint_restart_baseline(
                plan, result["baseline"]["mttr_s"], result["baseline"]["stall_s"]
            )
            plot_scale(plan, base, args.plot)
    except PlanError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2) if args.json else format_text(result))
    return 0


def _format_prediction(r: dict[str, Any]) -> str:
    measured = r["measured_efficiency"]
    m = "n/a" if measured is None else f"{100 * float(measured):.2f} %"
    return f"predicted efficiency {100 * r['predicted_efficiency']:.2f} %, measured {m}" + (
        "" if r["difference_pp"] is None else f" (difference {r['difference_pp']:+.2f} pp)"
    )
