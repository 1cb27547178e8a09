"""Fit the planner to measurements: one run's summary.json and events, or bench.recovery's MTTRs.

``predict_from_summary`` feeds a run's own step time, stall, fault rate, tiers and MTTRs into the model
and compares its prediction with the efficiency the run measured (the demo and ``make bench`` print it).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from goodput.model import Plan, PlanError, Tier, evaluate, plan_dict


def plan_from_summary(
    summary: dict[str, Any],
    interval_s: float | None = None,
    ckpt_interval_steps: int | None = None,
    fixed_s: float = 0.0,
) -> Plan:
    """The planner inputs measured in one run's ``summary.json`` (Contract 3, ``trainer.events.metrics``).

    - step time = productive_s / steps; interval = checkpoint interval in steps x step time (or
      ``interval_s``);
    - stall = mean blocked time per save (``ckpt.stall_s.mean``);
    - snapshot overhead = the snapshots' blocked time per productive second (``snapshot_overhead``);
    - one tier per tier number seen, with its share of the faults and the median of its ``mttr_s``
      (fault -> first kept step after it; ``trainer.events.metrics`` keeps the *last* execution of each step,
      so that is the first step after the restart, and the work lost is the earlier execution of the
      recomputed steps - the model's ``recompute``, not part of the MTTR);
    - rollback ``checkpoint`` when one of that tier's faults restored the durable checkpoint (its
      ``restored_from`` is ``fsx`` or ``local``, or, in summaries without it, it restored a checkpoint or
      recomputed steps), ``peer`` when it restored from a peer's replica, else ``memory``; a memory or
      peer tier recomputes ``rollback_s`` = (median steps recomputed + 0.5) x step time per fault (the
      half is the step in flight, on average half done);
    - fault rate = recovered faults / running time (wall minus recovery minus ``fixed_s``, the
      start-up and tail the model does not cover).
    """
    steps = _num(summary, "steps")
    wall = _num(summary, "wall_s")
    productive = _num(summary, "productive_s")
    if steps <= 0 or productive <= 0:
        raise PlanError("summary: steps and productive_s must be > 0")
    step_s = productive / steps
    if interval_s is None:
        if ckpt_interval_steps is None:
            raise PlanError("ckpt_interval_steps: not in summary.json; pass it (or interval_s)")
        interval_s = ckpt_interval_steps * step_s
    stall_stats = (summary.get("ckpt") or {}).get("stall_s") or {}
    stall = float(stall_stats.get("mean") or 0.0)
    by_tier: dict[str, list[tuple[float, str, int]]] = {}
    for f in incidents(summary.get("faults") or []):
        if f.get("mttr_s") is None:
            continue  # a fault the run never recovered from has no MTTR to plan with
        recomputed = int(f.get("steps_recomputed") or 0)
        by_tier.setdefault(f"tier{f.get('tier')}", []).append(
            (float(f["mttr_s"]), _rollback_of(f), recomputed)
        )
    n = sum(len(v) for v in by_tier.values())
    recovery = sum(r for v in by_tier.values() for r, _, _ in v)
    running = max(wall - recovery - fixed_s, productive)
    if n == 0:
        tiers: tuple[Tier, ...] = (Tier("none", 1.0, 0.0, "checkpoint"),)
    else:
        tiers = tuple(_fitted_tier(name, v, n, step_s) for name, v in sorted(by_tier.items()))
    # One "node" of one GPU, so that the per-GPU rate is the run's own fault rate.
    return Plan(1, 1, n / running * 3600.0, tiers, stall, interval_s, snapshot_overhead(summary))


def snapshot_overhead(summary: dict[str, Any]) -> float:
    """Seconds the snapshots blocked the loop per productive second: the loss breakdown's snapshot_stall
    (trainer.events.metrics), or in older summaries every snapshot's blocked time."""
    productive = float(summary.get("productive_s") or 0.0)
    loss = summary.get("loss_s") or {}
    blocked = loss.get("snapshot_stall")
    if blocked is None:
        blocked = ((summary.get("snapshot") or {}).get("blocked_s") or {}).get("total") or 0.0
    return float(blocked) / productive if productive > 0 else 0.0


def _rollback_of(fault: dict[str, Any]) -> str:
    """Where one fault rolled back to, from its ``restored_from`` (older summaries: its restore)."""
    source = fault.get("restored_from")
    if source in ("memory", "shm"):
        return "memory"
    if source == "peer":
        return "peer"
    if source in ("fsx", "local"):
        return "checkpoint"
    rolled_back = int(fault.get("steps_recomputed") or 0) > 0 or fault.get("restored_step") is not None
    return "checkpoint" if rolled_back else "memory"


def _fitted_tier(name: str, faults: list[tuple[float, str, int]], n: int, step_s: float) -> Tier:
    kinds = {k for _, k, _ in faults}
    mttr = _median([r for r, _, _ in faults])
    if "checkpoint" in kinds:
        return Tier(name, len(faults) / n, mttr, "checkpoint")
    redo = (_median([float(s) for _, _, s in faults]) + 0.5) * step_s
    return Tier(name, len(faults) / n, mttr, "peer" if "peer" in kinds else "memory", redo)


def incidents(faults: Sequence[dict[str, Any]], window_s: float = 5.0) -> list[dict[str, Any]]:
    """Merge fault reports that are one incident: a node loss makes every rank of the node report it.
    Node-loss reports of the same step within ``window_s`` of the first become one, keeping the first
    (its MTTR runs from the earliest report). trainer.events.metrics' summary already merges them; this keeps
    older summaries right. Other kinds fire once per spec, so two reports are two faults."""
    merged: list[dict[str, Any]] = []
    for f in sorted(faults, key=lambda f: float(f.get("t") or 0.0)):
        prev = merged[-1] if merged else None
        if (
            prev is not None
            and f.get("type") == "node-loss"
            and prev.get("type") == f.get("type")
            and prev.get("step") == f.get("step")
            and abs(float(f.get("t") or 0.0) - float(prev.get("t") or 0.0)) <= window_s
        ):
            continue
        merged.append(f)
    return merged


def run_overheads(out_dir: str | Path) -> dict[str, Any]:
    """What the model does not cover, measured from a run's events: start-up before the first step,
    the tail after the last one, and the run's checkpoint interval (from ``run_start``'s config)."""
    events: list[dict[str, Any]] = []
    for path in sorted(Path(out_dir).glob("events.rank*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a line torn by a SIGKILL
    if not events:
        return {}
    events.sort(key=lambda e: float(e["t"]))
    steps = [e for e in events if e["ev"] == "step" and int(e["rank"]) == 0]
    out: dict[str, Any] = {}
    if steps:
        out["startup_s"] = float(steps[0]["t_start"]) - float(events[0]["t"])
        out["tail_s"] = float(events[-1]["t"]) - max(float(e["t_end"]) for e in steps)
    start = next((e for e in events if e["ev"] == "run_start"), None)
    interval = ((start or {}).get("config") or {}).get("ckpt", {}).get("interval_steps")
    if interval:
        out["ckpt_interval_steps"] = int(interval)
    return out


def predict_from_summary(
    path: str | Path, interval_s: float | None = None, ckpt_interval_steps: int | None = None
) -> dict[str, Any]:
    """Predict a run's efficiency from its measured parameters and compare with what it measured.

    ``path`` is the run's summary.json; the event files next to it give the checkpoint interval and
    the start-up and tail times, which the steady-state model does not cover, nor the summary's
    ``straggler`` and ``eviction`` loss terms (added to them). ``predicted_efficiency``
    adds those measured fixed costs to the model's wall time (``productive / model_efficiency``);
    ``model_efficiency`` is the steady-state figure alone.
    """
    path = Path(path)
    summary = json.loads(path.read_text())
    extra = run_overheads(path.parent)
    # A straggler's wait and its eviction are measured one-off costs the model does not cover either
    # (goodput/straggler.py plans them at scale): fixed costs of this run, like its start-up.
    loss = summary.get("loss_s") or {}
    for term in ("straggler", "eviction"):
        if loss.get(term):
            extra[f"{term}_s"] = float(loss[term])
    steps_interval = ckpt_interval_steps or extra.get("ckpt_interval_steps")
    fixed = sum(float(extra.get(k, 0.0)) for k in ("startup_s", "tail_s", "straggler_s", "eviction_s"))
    plan = plan_from_summary(summary, interval_s, steps_interval, fixed)
    out = evaluate(plan)
    productive = float(summary["productive_s"])
    predicted = productive / (productive / out.efficiency + fixed) if out.efficiency > 0 else 0.0
    measured = summary.get("training_efficiency", summary.get("efficiency"))
    return {
        "predicted_efficiency": predicted,
        "model_efficiency": out.efficiency,
        "measured_efficiency": measured,
        "difference_pp": None if measured is None else 100.0 * (predicted - float(measured)),
        "fixed_overheads_s": {
            k: extra[k] for k in ("startup_s", "tail_s", "straggler_s", "eviction_s") if k in extra
        },
        "faults": len(incidents(summary.get("faults") or [])),
        "plan": plan_dict(plan),
        "lost": out.lost(),
    }


def _num(summary: dict[str, Any], key: str) -> float:
    if key not in summary:
        raise PlanError(f"summary: missing field {key!r}")
    return float(summary[key])


def _median(xs: Sequence[float]) -> float:
    s = sorted(xs)
    mid = len(s) // 2
    return s[mid] if len(s) % 2 else 0.5 * (s[mid - 1] + s[mid])


# Which bench.recovery scenario measures each default tier's MTTR.
MEASURED_SOURCES = {
    "in-process": "exception/tier1",
    "in-job": "sigkill/tier2",
    "job-restart": "exception/full",
}


def with_measured_mttrs(tiers: Sequence[Tier], recovery_result: dict[str, Any]) -> tuple[Tier, ...]:
    """``tiers`` with each MTTR replaced by the median MTTR that bench.recovery measured for it (a tier
    with no scenario in MEASURED_SOURCES keeps its own; one whose scenario is missing is an error)."""
    summary = recovery_result.get("summary") or {}
    out = []
    for t in tiers:
        source = MEASURED_SOURCES.get(t.name)
        if source is None:
            out.append(t)
            continue
        spread = (summary.get(source) or {}).get("mttr_s")
        if not spread:
            raise PlanError(f"tier {t.name}: no measured MTTR (scenario {source}) in the recovery result")
        out.append(replace(t, mttr_s=float(spread["median"])))
    return tuple(out)
