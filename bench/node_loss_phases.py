"""Where a node loss's recovery time goes, measured repeatedly: the demo's node loss (2 pods x 2 ranks and
a hot spare, snapshots every step replicated to the other node, the demo's model and batch) as local pods,
with the phases of tools/recovery_phases.py and, inside the restore phase, each rank's `spans` (the
`restore` event's breakdown, trainer/events/spans.py) for the ranks the restart started.

    python -m bench.node_loss_phases [--reps 3] [--tree A=PATH --tree B=PATH ...] [--out FILE]

With several `--tree`s the runs alternate A B A B ... (one repetition each per round) and every pod runs
the trainer of its tree (its PYTHONPATH): an A/B comparison of two checkouts on one machine at one load.
A run is ~30 s of a 2-core machine; the figures scale with what else runs (the 1-minute load is recorded).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench import podrun, recovery_pods
from bench.recovery_pods import FAIL_JOB_EXIT_CODES, PodsConfig, PodsScenario, make_data, measure
from bench.stats import spread
from tools.localjob import PodSpec
from tools.recovery_phases import PHASES
from trainer.runtime.ports import free_port

REPO = Path(__file__).resolve().parent.parent
SCENARIO = PodsScenario("node-loss/demo", 2, 1, 2, ("node-loss:step=8:node=1",), snapshots=True, steps=12)
DEMO_SHAPES = {"data.seq_len": 128, "data.micro_batch_size": 4}
"""tools/demo-values.yaml's batch (the model is the same tiny preset)."""


def pod_specs(tree: Path, run_dir: Path, data: Path, port: int, cfg: PodsConfig) -> list[PodSpec]:
    """The scenario's pods (bench.recovery_pods.pod_specs) with the demo's batch, running `tree`'s trainer."""
    from trainer.reference.config import chart_values

    return recovery_pods.pod_specs(
        SCENARIO, cfg, run_dir, data, port, extra_values=chart_values(DEMO_SHAPES), tree=tree
    )


def run_once(tree: Path, run_dir: Path, data: Path, cfg: PodsConfig) -> dict[str, Any]:
    podrun.fresh(run_dir)
    port = free_port()
    specs = pod_specs(tree, run_dir, data, port, cfg)
    run = podrun.run_job(
        specs,
        host_port=port,
        timeout_s=cfg.run_timeout_s,
        backoff_limit=len(specs) + 2,
        fail_job_exit_codes=FAIL_JOB_EXIT_CODES,
        replace_delay_s=cfg.replace_delay_s,
    )
    rec = measure(SCENARIO, run_dir, run.result, None, run.elapsed_s)
    rec["load_avg_1min"] = run.load_avg_1min
    rec["spans"] = restart_spans(run_dir / "out")
    return rec


def restart_spans(out: Path) -> dict[str, dict[str, float]]:
    """Each rank's `spans` of its first restore after the node loss (rank -> span -> seconds)."""
    from trainer.events.metrics import read_events

    events = read_events(out)[0] if out.is_dir() else []
    faults = [float(e["t"]) for e in events if e["ev"] == "fault_injected" and e["fault"] == "node-loss"]
    if not faults:
        return {}
    found: dict[str, dict[str, float]] = {}
    for e in events:
        if e["ev"] == "restore" and float(e["t"]) > faults[0] and "spans" in e:
            found.setdefault(str(e["rank"]), e["spans"])
    return found


def slowest(spans: dict[str, dict[str, float]]) -> dict[str, float]:
    """Per span, the slowest rank's seconds (the phase ends with the last rank)."""
    out: dict[str, float] = {}
    for per_rank in spans.values():
        for name, s in per_rank.items():
            out[name] = max(out.get(name, 0.0), s)
    return out


def _spread(values: Sequence[float]) -> str:
    """`median [min-max]` (bench.stats.spread), as the phase table prints it."""
    s = spread(values)
    return "-" if s is None else f"{s['median']:.2f} [{s['min']:.2f}-{s['max']:.2f}]"


def summarize(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per tree: median [min-max] of the MTTR, each phase and each span (slowest rank) over good runs."""
    out: dict[str, Any] = {}
    for tree in dict.fromkeys(r["tree"] for r in records):
        good = [r for r in records if r["tree"] == tree and r.get("ok") and r.get("phases")]
        entry: dict[str, Any] = {"runs": sum(1 for r in records if r["tree"] == tree), "ok": len(good)}
        entry["mttr_s"] = _spread([r["mttr_s"] for r in good])
        entry["load"] = _spread([r["load_avg_1min"] for r in good])
        for name in PHASES:
            entry[name] = _spread([r["phases"][name] for r in good])
        names = dict.fromkeys(n for r in good for n in slowest(r["spans"]))
        entry["spans"] = {n: _spread([slowest(r["spans"]).get(n, 0.0) for r in good]) for n in names}
        out[tree] = entry
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.node_loss_phases", description=__doc__.split("\n")[0])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--tree", action="append", default=[], help="NAME=PATH of a checkout (default: this one)")
    p.add_argument("--work", type=Path, default=REPO / "out" / "bench" / "node_loss_phases")
    p.add_argument("--out", type=Path, default=None, help="write every run's record and the summary (JSON)")
    args = p.parse_args(argv)
    trees = dict(t.split("=", 1) for t in args.tree) if args.tree else {"this": str(REPO)}
    cfg = PodsConfig(steps=SCENARIO.steps)
    data = make_data(args.work / "tokens.npy", cfg)
    records = []
    for rep in range(args.reps):
        for name, path in trees.items():
            rec = run_once(Path(path).resolve(), args.work / f"{name}-rep{rep}", data, cfg)
            rec.update(tree=name, rep=rep)
            records.append(rec)
            phases = rec.get("phases") or {}
            print(
                f"{name} rep {rep}: ok={rec['ok']} mttr={rec['mttr_s']} load={rec['load_avg_1min']:.2f} "
                + " ".join(f"{k}={v:.2f}" for k, v in phases.items())
                + "\n  spans (slowest rank): "
                + " ".join(f"{k}={v:.2f}" for k, v in slowest(rec["spans"]).items()),
                flush=True,
            )
    summary = summarize(records)
    print(json.dumps(summary, indent=1))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"runs": records, "summary": summary}, indent=1, default=str) + "\n")
    return 0 if all(r.get("ok") for r in records) else 1


if __name__ == "__main__":
    raise SystemExit(main())
