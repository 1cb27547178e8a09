"""The planner's command line: ``python -m goodput`` (text or JSON; ``--summary`` predicts a run)."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from goodput import inputs, straggler
from goodput.fit import predict_from_summary, with_measured_mttrs
from goodput.model import (
    Plan,
    PlanError,
    checkpoint_restart_baseline,
    evaluate,
    optimal_interval,
    plan_dict,
    plan_from_dict,
    young_daly_interval,
)
from goodput.plot import plot_scale
from goodput.profiles import PROFILES
from goodput.team import read_team, team_overrides, team_tiers
from goodput.tiers import SnapshotInputs, best_plan, parse_tier_spec, rollback_steps

DESCRIPTION = (
    "Goodput planner: expected training efficiency and the best checkpoint interval at cluster scale."
)

DEFAULT_TIERS = inputs.DEFAULT_TIERS


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
        "--tier",
        action="append",
        default=None,
        help="NAME:share=S:mttr=SEC[:rollback=checkpoint|memory|peer][:steps=N][:source=memory|shm|peer]"
        "[:fallback-mttr=SEC] (share may be a fraction like 63/419; default: "
        + ", ".join(DEFAULT_TIERS)
        + ")",
    )
    p.add_argument(
        "--measured",
        type=Path,
        default=None,
        help="take tier MTTRs from this bench.recovery result (bench/results/recovery.json)",
    )
    p.add_argument(
        "--rollback-from",
        type=Path,
        action="append",
        default=[],
        help="steps recomputed per fault by restore source, and the snapshot's blocked/floor ratio, from "
        "this file (bench/results/snapshot.json, a run's summary.json); repeatable",
    )
    p.add_argument(
        "--step-time",
        type=float,
        default=inputs.STEP_S,
        help=f"seconds per step (default {inputs.STEP_S:.1f})",
    )
    p.add_argument("--snapshot-every", type=int, default=None, help="steps per snapshot (default: best)")
    p.add_argument(
        "--snapshot-blocked",
        type=float,
        default=None,
        help="seconds one snapshot blocks the loop (default: state per GPU / D2H rate x blocked/floor ratio)",
    )
    p.add_argument(
        "--state-gib-per-gpu",
        type=float,
        default=inputs.STATE_GIB_PER_GPU,
        help=f"snapshot size per GPU (default {inputs.STATE_GIB_PER_GPU:.2f} GiB)",
    )
    p.add_argument("--d2h-gb-s", type=float, default=inputs.D2H_GB_S, help="device-to-host GB/s per GPU")
    p.add_argument(
        "--peer-correlated",
        type=float,
        default=inputs.PEER_CORRELATED,
        help=f"probability a node loss takes its replica peer too (default {inputs.PEER_CORRELATED:.3f})",
    )
    p.add_argument(
        "--rereplication-window",
        type=float,
        default=None,
        help="seconds a lost node's replicated state is on one side only (default: its MTTR + 1 snapshot)",
    )
    p.add_argument("--replicas", type=int, default=inputs.REPLICAS, help="peers holding each replica")
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
    p.add_argument(
        "--teams",
        type=Path,
        default=None,
        help="a teams file: take the nodes, step time, checkpoint interval, save stall and reload time of "
        "--team from the storage sizing (options given on the command line still win)",
    )
    p.add_argument("--team", default=None, help="the team in --teams (default: the first)")
    p.add_argument(
        "--straggler-rate",
        type=float,
        default=straggler.RATE_PER_NODE_DAY,
        help=f"stragglers per node-day (default {straggler.RATE_PER_NODE_DAY:.3g}: an assumption, "
        "goodput/straggler.py)",
    )
    p.add_argument(
        "--straggler-slowdown",
        type=float,
        default=straggler.SLOWDOWN,
        help=f"times slower the job runs with a straggler (default {straggler.SLOWDOWN:g}, assumed)",
    )
    p.add_argument(
        "--straggler-policy",
        choices=("evict", "report"),
        default="evict",
        help="evict into a hot spare (the chart's default) or only report (default evict)",
    )
    p.add_argument(
        "--straggler-mitigation",
        type=float,
        default=straggler.MITIGATION_S,
        help=f"seconds until a reported straggler is acted on (default {straggler.MITIGATION_S:.0f}, "
        "assumed)",
    )
    return p


def given_options(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> set[str]:
    """The options the command line gave (their dests), whatever their defaults."""
    probe = argparse.ArgumentParser(add_help=False, argument_default=argparse.SUPPRESS)
    for action in parser._actions:
        if action.option_strings and action.dest != "help":
            kwargs: dict[str, Any] = {"dest": action.dest}
            if action.nargs == 0:
                kwargs["action"] = "store_const"
                kwargs["const"] = True
            probe.add_argument(*action.option_strings, **kwargs)
    known, _ = probe.parse_known_args(argv)
    return set(vars(known))


def apply_team(args: argparse.Namespace, given: set[str]) -> dict[str, Any] | None:
    """Set the team's figures on `args` (not those given); the team block of the result, or None."""
    if args.teams is None:
        if args.team is not None:
            raise PlanError("--team needs --teams (the teams file)")
        return None
    name, sizing = read_team(args.teams, args.team)
    for key, value in team_overrides(sizing).items():
        if key not in given:
            setattr(args, key, value)
    if "tier" not in given:
        args.tier = list(team_tiers(DEFAULT_TIERS, sizing.reload_s))
    return {"name": name, "teams_file": str(args.teams), "sizing": sizing.as_dict()}


def _snapshot_blocked(args: argparse.Namespace) -> dict[str, Any]:
    """Seconds one snapshot blocks, and where the figure comes from."""
    if args.snapshot_blocked is not None:
        return {"blocked_s": float(args.snapshot_blocked), "from": "given"}
    for key in ("state_gib_per_gpu", "d2h_gb_s"):
        if not getattr(args, key) > 0 or math.isinf(getattr(args, key)):
            raise PlanError(
                f"--{key.replace('_', '-')} must be a finite number > 0, got {getattr(args, key)}"
            )
    floor = args.state_gib_per_gpu * 2**30 / (args.d2h_gb_s * 1e9)
    measured = inputs.measured_blocked_over_floor(args.rollback_from)
    ratio, source = (
        (measured[0], f"measured at {measured[1]} MiB/rank")
        if measured
        else (inputs.BLOCKED_OVER_FLOOR, "default (the issue's target)")
    )
    return {
        "blocked_s": floor * ratio,
        "floor_s": floor,
        "blocked_over_floor": ratio,
        "from": source,
        "state_gib_per_gpu": args.state_gib_per_gpu,
        "d2h_gb_s": args.d2h_gb_s,
    }


def run_plan(args: argparse.Namespace) -> dict[str, Any]:
    """Everything the CLI prints, as a dict."""
    specs = tuple(parse_tier_spec(s) for s in (args.tier or DEFAULT_TIERS))
    if args.measured is not None:
        measured_tiers = with_measured_mttrs(
            tuple(s.tier() for s in specs), json.loads(args.measured.read_text())
        )
        specs = tuple(replace(s, mttr_s=t.mttr_s) for s, t in zip(specs, measured_tiers, strict=True))
    steps = rollback_steps(specs, inputs.measured_rollbacks(args.rollback_from), inputs.DEFAULT_STEPS)
    blocked = _snapshot_blocked(args)
    snap = SnapshotInputs(
        args.step_time, blocked["blocked_s"], args.snapshot_every, args.rereplication_window
    )
    base = Plan(
        args.nodes,
        args.gpus_per_node,
        _rate(args),
        tuple(s.tier() for s in specs),
        args.stall,
        args.interval or 1.0,
        peer_correlated=args.peer_correlated,
        replicas=args.replicas,
    )
    plan, every = best_plan(base, specs, steps, snap)
    exact = optimal_interval(plan)
    if args.interval is None:
        plan = plan.with_(interval_s=exact if math.isfinite(exact) and exact > 0 else 3600.0)
    out = evaluate(plan)
    base_mttr = args.baseline_mttr if args.baseline_mttr is not None else max(s.mttr_s for s in specs)
    base_plan = checkpoint_restart_baseline(plan, base_mttr, args.baseline_stall)
    base_opt = optimal_interval(base_plan)
    base_out = evaluate(base_plan, base_opt if math.isfinite(base_opt) and base_opt > 0 else plan.interval_s)
    result = {
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
        "snapshots": {
            "every_steps": every,
            "step_s": args.step_time,
            **blocked,
            "rollback_steps": steps,
            "peer_loss_probability": plan.peer_loss_probability,
        },
        "baseline": {
            "mttr_s": base_mttr,
            "stall_s": base_plan.stall_s,
            "interval_s": base_opt,
            "efficiency": base_out.efficiency,
        },
    }
    result["stragglers"] = _stragglers(args, plan, specs, out.efficiency)
    if getattr(args, "team_block", None) is not None:
        result["team"] = args.team_block
    return result


def _stragglers(args: argparse.Namespace, plan: Plan, specs: Any, efficiency: float) -> dict[str, Any]:
    """The straggler term (goodput/straggler.py): evicted at a node loss's cost (the peer tier's MTTR)."""
    term = straggler.StragglerTerm(
        args.straggler_rate, args.straggler_slowdown, args.straggler_policy, args.straggler_mitigation
    )
    peers = [s.mttr_s for s in specs if s.rollback == "peer"]
    evict_mttr = peers[0] if peers else max(s.mttr_s for s in specs)
    lost = term.lost(plan.nodes, args.step_time, evict_mttr)
    return {
        "rate_per_node_day": term.rate_per_node_day,
        "slowdown": term.slowdown,
        "policy": term.policy,
        "cost_s": term.cost_s(args.step_time, evict_mttr),
        "lost": lost,
        "efficiency": efficiency * (1.0 - lost),
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
    snap = r["snapshots"]
    if snap["every_steps"] is not None:
        lines[2:2] = [
            f"snapshots          every {snap['every_steps']} steps of {snap['step_s']:.3g} s, "
            f"{1e3 * snap['blocked_s']:.1f} ms blocked each (blocked/floor: {snap['from']}); "
            f"replica lost with its node: p = {snap['peer_loss_probability']:.3g}",
            *(
                f"  {name:<16} {rb['steps']:g} steps recomputed per fault + the snapshot lag, {rb['from']}"
                for name, rb in snap["rollback_steps"].items()
            ),
        ]
    if "team" in r:
        t, z = r["team"], r["team"]["sizing"]
        lines.insert(
            1,
            f"team               {t['name']} ({t['teams_file']}): checkpoint {z['checkpoint_gb']:,.1f} GB, "
            f"durable write {z['write_s']:.0f} s and whole-job reload {z['reload_s']:.0f} s at "
            f"{z['durable_mbps']:,.0f} MB/s (storage sizing)",
        )
        lines[2:2] = [f"  storage problem: {p}" for p in z["problems"]]
        lines[2:2] = [f"  storage warning: {w}" for w in z["warnings"]]
    lines += [f"  {k:<24} {100 * v:6.2f}" for k, v in r["lost"].items()]
    if "stragglers" in r:
        st = r["stragglers"]
        lines.append(
            f"stragglers         {st['rate_per_node_day']:.3g}/node-day at {st['slowdown']:g}x, "
            f"{st['policy']}: {st['cost_s']:.0f} s each, {100 * st['lost']:.2f} % of wall lost -> "
            f"{100 * st['efficiency']:.2f} % with them (assumed rates: goodput/straggler.py)"
        )
    b = r["baseline"]
    lines.append(
        f"baseline           checkpoint-restart only (MTTR {b['mttr_s']:.0f} s, stall {b['stall_s']:.3g} s, "
        f"interval {b['interval_s']:.0f} s): {100 * b['efficiency']:.2f} %"
    )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        args.team_block = apply_team(args, given_options(parser, argv))
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
