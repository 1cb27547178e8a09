"""``make bench``: every benchmark in one invocation, then the report.

    python -m bench [--quick] [--only recovery,pods,ckpt_stall,snapshot,guard,synth,scale,planner]
                    [--results DIR] [--no-readme]

Parts (each writes ``<results>/<part>.json``; a failing part is recorded and the others still run):

- recovery    bench.recovery: tier 1 vs tier 2 vs full restart, hang detection (several repetitions)
- pods        bench.recovery_pods: node loss with and without a hot spare, compound faults (a second
              fault during recovery), as several local pods (--quick: node loss only, one repetition)
- ckpt_stall  ``python -m bench.ckpt_stall --mib 64 256 1024 --out <json>`` (the checkpoint engineer's
              bench; --quick: its own short pass)
- snapshot    ``python -m bench.snapshot --mib 64 256 1024 --faults 3 --out <json>``: host-memory snapshot
              blocked time vs the one-copy floor, host memory per rank, restore time per source, steps
              recomputed per fault (a node loss restored from its peer's replica among them)
- guard       ``python -m bench.guard --reps 7 --batch 16 --out <json>``: the numerical guard's cost per
              step, the same training steps with it on and off, median and range over repetitions
              (--quick: 3)
- synth       ``python -m bench.synth --teams 1 5 20 50 --repeats 3 --out <json>`` (the infra
              engineer's bench; --quick: teams 1 and 5, one repeat)
- scale       ``python -m bench.scale --size full --out <json>``: how the rendezvous, the node beats, the
              restore agreement, the exporter and the event log grow with nodes, ranks and steps, by
              simulation against a real TCPStore and synthetic event files, fitted on log-log axes and
              projected to 2,048 nodes x 8 ranks (--quick: smaller sizes). Alone: --only scale
- planner     the goodput planner's default plan, its Monte Carlo check, the scale plot, the plan
              with the MTTRs measured by the recovery part, and the prediction of the last
              `make demo` run (the summary.json named in out/demo/report.json), if there is one

Then bench.report writes ``<results>/RESULTS.md`` and the README section between the bench markers.

Each part runs under a load monitor (bench/load.py): the CPU that other processes took while it ran is
recorded in meta.json and printed in the report. A part measured beside other work (more than
``QUIET_FOREIGN_CORES`` cores of it on average) does not replace the committed result: its JSON goes to
``<results>/loaded/`` and the previous one stays, unless ``--allow-loaded`` (then it is marked LOADED).
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import goodput
from bench import recovery, recovery_pods, report, snapshot
from bench.load import QUIET_FOREIGN_CORES, LoadMonitor
from goodput.cli import build_parser, run_plan
from goodput.montecarlo import simulate
from goodput.node_loss import node_loss_parts, rendezvous_fit_from
from goodput.plot import plot_scale

REPO = Path(__file__).resolve().parent.parent
PARTS = ("recovery", "pods", "ckpt_stall", "snapshot", "guard", "synth", "scale", "planner")
RESULT_FILES = {"pods": "recovery_pods.json"}  # the JSON each part writes, when not <part>.json


def result_file(results: Path, part: str) -> Path:
    return results / RESULT_FILES.get(part, f"{part}.json")


def keep_or_set_aside(results: Path, part: str, previous: bytes | None, load: dict[str, Any]) -> str:
    """After a part measured beside other work: move its new JSON to <results>/loaded/ and put the
    previous result back. Returns what was done, for the record."""
    new = result_file(results, part)
    if not new.is_file():
        return "no result written"
    aside = results / "loaded" / new.name
    aside.parent.mkdir(parents=True, exist_ok=True)
    new.replace(aside)
    if previous is not None:
        new.write_bytes(previous)
    return (
        f"not published: other work took {load['foreign_cores_mean']:.2f} cores on average "
        f"(limit {QUIET_FOREIGN_CORES}); the result is in {_rel(aside)}"
    )


def run_recovery(results: Path, quick: bool) -> None:
    cfg = recovery.RecoveryConfig()
    names = list(recovery.QUICK) if quick else list(recovery.SCENARIOS)
    res = recovery.run(names, 1 if quick else 3, REPO / "out" / "bench" / "recovery", cfg)
    _write(results / "recovery.json", res)
    failed = {n: s for n, s in res["summary"].items() if s["ok"] < s["runs"]}
    if failed:
        raise RuntimeError(f"recovery runs failed: {sorted(failed)} (see out/bench/recovery/*/pod*.log)")


def run_pods(results: Path, quick: bool) -> None:
    # The node loss with snapshots is bench.snapshot's (its rollback feeds the planner): not run twice.
    full = [n for n in recovery_pods.SCENARIOS if n not in snapshot.POD_FAULT_SCENARIOS]
    names = list(recovery_pods.QUICK) if quick else full
    cfg = recovery_pods.PodsConfig()
    res = recovery_pods.run(names, 1 if quick else 3, REPO / "out" / "bench" / "recovery_pods", cfg)
    _write(results / "recovery_pods.json", res)
    failed = {n: s for n, s in res["summary"].items() if s["ok"] < s["runs"]}
    if failed:
        raise RuntimeError(f"pod recovery runs failed: {sorted(failed)} (see out/bench/recovery_pods/*/logs)")


def run_module(module: str, out: Path, args: Sequence[str], timeout_s: float) -> None:
    """Run another engineer's bench as ``python -m <module> <args> --out <json>``."""
    if importlib.util.find_spec(module) is None:
        raise RuntimeError(f"{module} does not exist yet")
    cmd = [sys.executable, "-m", module, *args, "--out", str(out)]
    print(" ".join(cmd[1:]), flush=True)
    subprocess.run(cmd, check=True, cwd=REPO, timeout=timeout_s)
    if not out.is_file():
        raise RuntimeError(f"{module} exited 0 but wrote no {out}")


# The other engineers' benches and their arguments (full, quick).
SYNTH_ARGS = (["--teams", "1", "5", "20", "50", "--repeats", "3"], ["--teams", "1", "5", "--repeats", "1"])
CKPT_ARGS = (["--mib", "64", "256", "1024"], ["--quick"])
SCALE_ARGS = (["--size", "full"], ["--quick"])  # full: a few minutes at 2,048 nodes / 16,384 ranks
GUARD_ARGS = (["--reps", "7", "--batch", "16"], ["--reps", "3", "--steps", "10", "--batch", "16"])
SNAPSHOT_ARGS = (
    ["--mib", "64", "256", "1024", "--faults", "3"],
    ["--mib", "64", "--reps", "3", "--faults", "1"],
)


MC_CASES: tuple[tuple[str, dict[str, Any]], ...] = (
    ("Llama 3 rate, 16k GPUs, default tiers", {}),
    ("10x the rate, 16k GPUs", {"rate_per_gpu_hour": 10 * goodput.PROFILES["llama3-405b"][0]}),
    (
        "1k GPUs, checkpoint-restart only",
        {"nodes": 128, "tiers": (goodput.Tier("job-restart", 1.0, 900.0),), "snapshot_overhead": 0.0},
    ),
    ("16k GPUs, half the node losses take the replica too", {"peer_correlated": 0.5}),
)


def run_planner(results: Path, quick: bool) -> None:
    # The headline plan takes its rollbacks and the snapshot's blocked/floor ratio from bench.snapshot.
    measured = [str(results / "snapshot.json")] if (results / "snapshot.json").is_file() else []
    args = build_parser().parse_args([f"--rollback-from={m}" for m in measured])
    default = run_plan(args)
    plan = _plan_of(default)
    base = goodput.checkpoint_restart_baseline(plan, default["baseline"]["mttr_s"])
    plot_scale(plan, base, results / "planner_scale.png")
    mc = []
    for name, changes in MC_CASES:
        p = plan.with_(**changes)
        tau = goodput.optimal_interval(p)
        sim = simulate(p, tau, segments=400_000, seed=1)
        mc.append(
            {
                "case": name,
                "interval_s": tau,
                "model": goodput.evaluate(p, tau).efficiency,
                "simulated": sim.efficiency,
                "stderr": sim.stderr,
            }
        )
    out: dict[str, Any] = {
        "command": "python -m goodput" + "".join(f" --rollback-from {_rel(Path(m))}" for m in measured),
        "default": default,
        "peer_correlated": [
            {
                "peer_correlated": q,
                "efficiency": run_plan(replace_args(args, peer_correlated=q))["efficiency"],
            }
            for q in (0.0, args.peer_correlated, 0.5, 1.0)
        ],
        "montecarlo": mc,
        "scale": {
            "tiers": goodput.scale_sweep(plan, goodput.DEFAULT_SCALES),
            "checkpoint_restart_only": goodput.scale_sweep(base, goodput.DEFAULT_SCALES),
        },
        "scale_png": "bench/results/planner_scale.png",
    }
    # The node-loss MTTR's parts at the plan's size, with this run's rendezvous fit when scale ran.
    fit = rendezvous_fit_from(results / "scale.json") if (results / "scale.json").is_file() else None
    out["node_loss_mttr"] = node_loss_parts(plan.gpus, fit).as_dict() | {"rendezvous_fit": fit}
    measured = _measured_plan(results, plan)
    if measured:
        out["measured"] = measured
    runs = _predict_recovery_runs(results)
    if runs:
        out["recovery_runs"] = runs
    demo = _demo_summary()
    if demo is not None:
        try:
            out["demo"] = {"path": _rel(demo)} | goodput.predict_from_summary(demo)
        except (goodput.PlanError, KeyError, ValueError) as err:
            out["demo_error"] = str(err)
    _write(results / "planner.json", out)


def replace_args(args: Any, **changes: Any) -> Any:
    """A copy of parsed CLI arguments with some replaced."""
    import argparse

    return argparse.Namespace(**{**vars(args), **changes})


def _predict_recovery_runs(results: Path) -> list[dict[str, Any]]:
    """The planner's prediction of every successful recovery run from its own measured parameters."""
    path = results / "recovery.json"
    if not path.is_file():
        return []
    out = []
    for rec in json.loads(path.read_text())["runs"]:
        summary = Path(rec.get("out_dir", "")) / "summary.json"
        if not rec.get("ok") or not summary.is_file() or rec.get("unplanned_restarts"):
            continue  # the planner is fed the injected fault only: a run with others is not comparable
        try:
            p = goodput.predict_from_summary(summary)
        except (goodput.PlanError, KeyError, ValueError):
            continue
        out.append(
            {
                "scenario": rec["scenario"],
                "rep": rec["rep"],
                "measured": p["measured_efficiency"],
                "predicted": p["predicted_efficiency"],
                "difference_pp": p["difference_pp"],
            }
        )
    return out


def _demo_summary() -> Path | None:
    """The summary.json of the last `make demo` run (tools/demo.py names it in out/demo/report.json)."""
    report_json = REPO / "out" / "demo" / "report.json"
    if not report_json.is_file():
        return None
    path = Path(json.loads(report_json.read_text()).get("summary", ""))
    return path if path.is_file() else None


def _rel(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(REPO))
    except ValueError:
        return str(path)


def _plan_of(result: dict[str, Any]) -> goodput.Plan:
    return goodput.plan_from_dict(result["plan"])


def _measured_plan(results: Path, plan: goodput.Plan) -> dict[str, Any] | None:
    """The default plan with each tier's MTTR replaced by the local recovery measurement."""
    path = results / "recovery.json"
    if not path.is_file():
        return None
    try:
        tiers = goodput.with_measured_mttrs(plan.tiers, json.loads(path.read_text()))
    except goodput.PlanError:
        return None
    p = plan.with_(tiers=tiers)
    tau = goodput.optimal_interval(p)
    names = [t.name for t in tiers]
    kept = [n for n in names if n not in goodput.MEASURED_SOURCES]
    return {
        "note": "median MTTRs of "
        + ", ".join(f"{k} = `{v}`" for k, v in goodput.MEASURED_SOURCES.items() if k in names)
        + (f"; {', '.join(kept)} not measured here (its assumed MTTR kept)" if kept else "")
        + "; same shares, rate, rollbacks and stall",
        "gpus": p.gpus,
        "tiers": [t.__dict__ for t in tiers],
        "interval_s": tau,
        "efficiency": goodput.evaluate(p, tau).efficiency,
    }


def _load_json(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.is_file() else {}


def _write(path: Path, obj: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=2, default=str) + "\n")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    p.add_argument(
        "--quick", action="store_true", help="a short pass: fewer scenarios and sizes, one repetition"
    )
    p.add_argument("--only", default=",".join(PARTS), help=f"comma-separated subset of {','.join(PARTS)}")
    p.add_argument("--results", type=Path, default=REPO / "bench" / "results")
    p.add_argument("--no-readme", action="store_true", help="do not touch README.md")
    p.add_argument(
        "--allow-loaded",
        action="store_true",
        help="publish a part's result even when other work loaded the machine while it ran (marked LOADED)",
    )
    args = p.parse_args(argv)
    parts = [x.strip() for x in args.only.split(",") if x.strip()]
    bad = [x for x in parts if x not in PARTS]
    if bad:
        p.error(f"--only: unknown part(s) {bad}; choose from {PARTS}")

    jobs: dict[str, Callable[[], None]] = {
        "recovery": lambda: run_recovery(args.results, args.quick),
        "pods": lambda: run_pods(args.results, args.quick),
        "ckpt_stall": lambda: run_module(
            "bench.ckpt_stall", args.results / "ckpt_stall.json", CKPT_ARGS[args.quick], 900
        ),
        "snapshot": lambda: run_module(
            # 3 sizes, then 3 x 3 faulted runs and 3 node losses (~2 min each): ~25 min on 2 loaded cores
            "bench.snapshot",
            args.results / "snapshot.json",
            SNAPSHOT_ARGS[args.quick],
            2400,
        ),
        "guard": lambda: run_module("bench.guard", args.results / "guard.json", GUARD_ARGS[args.quick], 900),
        "synth": lambda: run_module("bench.synth", args.results / "synth.json", SYNTH_ARGS[args.quick], 900),
        "scale": lambda: run_module("bench.scale", args.results / "scale.json", SCALE_ARGS[args.quick], 900),
        "planner": lambda: run_planner(args.results, args.quick),
    }
    args.results.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    status: dict[str, dict[str, Any]] = {}
    for part in PARTS:  # fixed order: the planner reads the recovery result
        if part not in parts:
            continue
        print(f"== bench {part}", flush=True)
        t = time.monotonic()
        previous = (
            result_file(args.results, part).read_bytes()
            if result_file(args.results, part).is_file()
            else None
        )
        monitor = LoadMonitor().start()
        try:
            jobs[part]()
            status[part] = {"ok": True}
        except Exception as err:  # one broken part must not cost the others' results
            status[part] = {"ok": False, "error": f"{type(err).__name__}: {err}"}
            print(f"bench {part} FAILED: {status[part]['error']}", flush=True)
        load = monitor.stop()
        status[part]["seconds"] = round(time.monotonic() - t, 1)
        status[part]["load"] = load
        if not load["quiet"]:
            if args.allow_loaded:
                status[part]["published"] = "LOADED: published with --allow-loaded"
            else:
                status[part]["published"] = keep_or_set_aside(args.results, part, previous, load)
            print(f"bench {part}: {status[part]['published']}", flush=True)
    # A run of some parts (--only) keeps the record of the others' last run.
    old = _load_json(args.results / "meta.json") if len(parts) < len(PARTS) else {}
    merged = {**(old.get("parts") or {}), **status}
    meta = {
        "command": "python -m bench" + (" --quick" if args.quick else ""),
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}",
        "total_s": sum(float(p.get("seconds", 0.0)) for p in merged.values()),
        "wall_s": time.monotonic() - t0,
        "parts": merged,
    }
    _write(args.results / "meta.json", meta)
    report.write(args.results, None if args.no_readme else REPO / "README.md")
    print(json.dumps(status, indent=1))
    published = all(s["load"]["quiet"] or args.allow_loaded for s in status.values())
    return 0 if all(s["ok"] for s in status.values()) and published else 1


if __name__ == "__main__":
    raise SystemExit(main())
