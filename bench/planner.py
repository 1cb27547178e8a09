"""Goodput planner: expected training efficiency and the best checkpoint interval at cluster scale.

The model
---------
A job runs on ``G = nodes * gpus_per_node`` GPUs. Faults arrive as a Poisson process with rate
``lam = G * rate_per_gpu_hour / 3600`` per second of *running* time (computing or blocked in a
checkpoint save); no fault arrives while the job is recovering. Each fault is handled by exactly one
tier ``k``, chosen independently with probability ``share_k`` (shares sum to 1). Tier ``k`` costs
``mttr_k`` seconds of wall time (fault -> first productive step after it: detection, teardown,
restart, reload) and rolls the job back either

* to the last checkpoint (``rollback="checkpoint"``): the work done since that checkpoint is lost and
  recomputed, or
* to the last completed step, from memory (``rollback="memory"``): nothing is recomputed (the step in
  flight when the fault hit is neglected; it is below one step time).

The job saves a checkpoint after every ``interval`` seconds of productive compute; each save blocks
training for ``stall`` seconds; a checkpoint is durable once its stall ends (the model ignores the
commit latency of the background write of an async save: a fault inside that window would roll back
one checkpoint further). A fault during the stall loses the save.

Because faults are memoryless, the run is a renewal process over *segments* of ``T = interval +
stall`` running seconds between durable checkpoints. Split the faults into rollback faults (rate
``lam_r = lam * sum of rollback shares``) and memory faults (rate ``lam_m``). The running time spent
to get one segment through is the classic restart-from-scratch result ``E[run] = expm1(lam_r T) /
lam_r``; the expected number of rollback faults in it is ``expm1(lam_r T)``; memory faults hit that
running time at rate ``lam_m``. So, exactly within the model::

    E[wall per segment] = E[run] + expm1(lam_r T) * Rr + lam_m * E[run] * Rm
                        = expm1(lam_r T) * ((1 + lam_m Rm) / lam_r + Rr)
    efficiency          = interval / E[wall per segment]

with ``Rr`` and ``Rm`` the share-weighted mean MTTRs of the rollback and the memory tiers. The lost
time splits into the stall of the durable save, recompute (``E[run] - T``: work and aborted saves
rolled back) and recovery per tier.

Optimal interval: ``wall / interval`` is ``C * expm1(lam_r (tau + stall)) / tau`` with ``C``
independent of ``tau``, so the optimum depends only on the rollback fault rate and the stall - faults
handled from memory never call for more checkpoints. Setting the derivative to zero gives
``exp(lam_r stall) * exp(u) * (1 - u) = 1`` with ``u = lam_r tau``, which has one root in (0, 1); we
solve it by bisection (the "exact" optimum; it equals ``(1 + W0(-exp(-1 - lam_r stall))) / lam_r``).
The first-order Young/Daly interval is ``sqrt(2 * stall * MTBF_r)`` with ``MTBF_r = 1 / lam_r``.

``bench.montecarlo`` simulates the same model event by event; ``tests/bench`` checks that both agree.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

Rollback = Literal["checkpoint", "memory"]
ROLLBACKS: tuple[str, ...] = ("checkpoint", "memory")

# Failure rates per GPU-hour of named runs.
PROFILES: dict[str, tuple[float, str]] = {
    # Llama 3 405B pre-training: 419 unexpected interruptions in a 54-day snapshot on 16,384 H100
    # (Llama Team, "The Llama 3 Herd of Models", arXiv:2407.21783, section 3.3.4).
    "llama3-405b": (
        419 / (54 * 24 * 16384),
        "Llama 3 405B: 419 unexpected interruptions, 54 days, 16,384 H100",
    ),
    # Meta RSC cluster study (Kokolis et al., "Revisiting Reliability in Large-Scale Machine Learning
    # Research Clusters", HPCA 2025, arXiv:2410.21680): projected job MTTF 7.9 h at 1,024 GPUs and
    # 1.8 h at 16,384 GPUs (A100).
    "rsc-1k": (1 / (7.9 * 1024), "Meta RSC: MTTF 7.9 h for 1,024-GPU jobs"),
    "rsc-16k": (1 / (1.8 * 16384), "Meta RSC: MTTF 1.8 h for 16,384-GPU jobs"),
}


class PlanError(ValueError):
    """An invalid planner input; the message names the field."""


@dataclass(frozen=True)
class Tier:
    """One recovery tier: the share of faults it handles, its MTTR and where it rolls back to."""

    name: str
    share: float
    """Fraction of all faults this tier handles, in [0, 1]."""
    mttr_s: float
    """Seconds from the fault to the first productive step after it."""
    rollback: Rollback = "checkpoint"
    """``checkpoint``: recompute since the last checkpoint; ``memory``: nothing is recomputed."""

    def __post_init__(self) -> None:
        if not self.name:
            raise PlanError("tier.name must not be empty")
        if not 0.0 <= self.share <= 1.0 or math.isnan(self.share):
            raise PlanError(f"tier {self.name}: share must be in [0, 1], got {self.share}")
        if not self.mttr_s >= 0.0 or math.isinf(self.mttr_s):
            raise PlanError(f"tier {self.name}: mttr_s must be a finite number >= 0, got {self.mttr_s}")
        if self.rollback not in ROLLBACKS:
            raise PlanError(f"tier {self.name}: rollback must be one of {ROLLBACKS}, got {self.rollback!r}")


@dataclass(frozen=True)
class Plan:
    """Validated inputs of the model (see the module docstring)."""

    nodes: int
    gpus_per_node: int
    rate_per_gpu_hour: float
    """Faults per GPU-hour (all tiers together)."""
    tiers: tuple[Tier, ...]
    stall_s: float
    """Seconds training is blocked per checkpoint save."""
    interval_s: float
    """Seconds of productive compute between checkpoint saves."""

    def __post_init__(self) -> None:
        if self.nodes < 1:
            raise PlanError(f"nodes must be >= 1, got {self.nodes}")
        if self.gpus_per_node < 1:
            raise PlanError(f"gpus_per_node must be >= 1, got {self.gpus_per_node}")
        if not self.rate_per_gpu_hour >= 0.0 or math.isinf(self.rate_per_gpu_hour):
            raise PlanError(f"rate_per_gpu_hour must be a finite number >= 0, got {self.rate_per_gpu_hour}")
        if not self.tiers:
            raise PlanError("tiers must name at least one tier")
        names = [t.name for t in self.tiers]
        if len(set(names)) != len(names):
            raise PlanError(f"tiers: names must be unique, got {names}")
        total = sum(t.share for t in self.tiers)
        if abs(total - 1.0) > 1e-6:
            raise PlanError(f"tiers: shares must sum to 1, got {total:.6g}")
        if not self.stall_s >= 0.0 or math.isinf(self.stall_s):
            raise PlanError(f"stall_s must be a finite number >= 0, got {self.stall_s}")
        if not self.interval_s > 0.0 or math.isinf(self.interval_s):
            raise PlanError(f"interval_s must be a finite number > 0, got {self.interval_s}")

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def fault_rate_s(self) -> float:
        """Job-wide faults per second of running time."""
        return self.gpus * self.rate_per_gpu_hour / 3600.0

    @property
    def rollback_rate_s(self) -> float:
        """Faults per running second that roll back to the last checkpoint."""
        return self.fault_rate_s * sum(t.share for t in self.tiers if t.rollback == "checkpoint")

    def with_(self, **changes: Any) -> Plan:
        """A copy with some fields replaced (validated again)."""
        values = {f: getattr(self, f) for f in self.__dataclass_fields__}
        values.update(changes)
        return Plan(**values)


@dataclass(frozen=True)
class Outcome:
    """Expected efficiency at one interval and where the rest of the wall time goes (fractions)."""

    efficiency: float
    stall: float
    recompute: float
    recovery: dict[str, float] = field(default_factory=dict)
    wall_per_segment_s: float = 0.0
    faults_per_segment: float = 0.0

    def lost(self) -> dict[str, float]:
        """Lost time by cause, as fractions of wall time."""
        return {"stall": self.stall, "recompute": self.recompute} | {
            f"recovery:{name}": v for name, v in self.recovery.items()
        }


def evaluate(plan: Plan, interval_s: float | None = None) -> Outcome:
    """Expected efficiency and lost-time breakdown of ``plan`` (at ``interval_s`` if given)."""
    tau = plan.interval_s if interval_s is None else interval_s
    if not tau > 0:
        raise PlanError(f"interval_s must be > 0, got {tau}")
    lam = plan.fault_rate_s
    lam_r = plan.rollback_rate_s
    seg = tau + plan.stall_s
    x = lam_r * seg
    if x > 700.0:  # exp overflows: the job essentially never completes a segment
        return Outcome(0.0, 0.0, 1.0, {t.name: 0.0 for t in plan.tiers}, math.inf, math.inf)
    rollbacks = math.expm1(x)  # expected rollback faults per segment
    run = rollbacks / lam_r if lam_r > 0 else seg  # expected running time per segment
    recovery_s: dict[str, float] = {}
    for tier in plan.tiers:
        if tier.rollback == "checkpoint":
            # Rollback faults of this tier per segment: its share of all rollback faults.
            n = rollbacks * tier.share * lam / lam_r if lam_r > 0 else 0.0
        else:
            n = lam * tier.share * run
        recovery_s[tier.name] = n * tier.mttr_s
    wall = run + sum(recovery_s.values())
    faults = lam * run
    return Outcome(
        efficiency=tau / wall,
        stall=plan.stall_s / wall,
        recompute=(run - seg) / wall,
        recovery={k: v / wall for k, v in recovery_s.items()},
        wall_per_segment_s=wall,
        faults_per_segment=faults,
    )


def young_daly_interval(plan: Plan) -> float:
    """First-order optimum ``sqrt(2 * stall * MTBF)`` over the faults that roll back (inf if none)."""
    lam_r = plan.rollback_rate_s
    if lam_r == 0.0:
        return math.inf
    return math.sqrt(2.0 * plan.stall_s / lam_r)


def optimal_interval(plan: Plan) -> float:
    """The interval that maximizes ``evaluate(plan).efficiency`` exactly (inf: never save; 0: always)."""
    lam_r = plan.rollback_rate_s
    if lam_r == 0.0:
        return math.inf
    if plan.stall_s == 0.0:
        return 0.0
    a = lam_r * plan.stall_s
    # h(u) = exp(a + u) (1 - u) - 1 falls strictly from expm1(a) > 0 at u=0 to -1 at u=1.
    lo, hi = 0.0, 1.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if math.exp(a + mid) * (1.0 - mid) - 1.0 > 0.0:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-15:
            break
    return 0.5 * (lo + hi) / lam_r


def checkpoint_restart_baseline(plan: Plan, mttr_s: float, stall_s: float | None = None) -> Plan:
    """The same job with one tier only: every fault restarts the whole job from the last checkpoint."""
    return plan.with_(
        tiers=(Tier("job-restart", 1.0, mttr_s, "checkpoint"),),
        stall_s=plan.stall_s if stall_s is None else stall_s,
    )


def scale_sweep(plan: Plan, gpu_counts: Sequence[int]) -> list[dict[str, float]]:
    """Efficiency at the optimal interval for each GPU count (nodes = gpus / gpus_per_node)."""
    rows = []
    for gpus in gpu_counts:
        nodes = max(1, gpus // plan.gpus_per_node)
        p = plan.with_(nodes=nodes)
        opt = optimal_interval(p)
        tau = opt if math.isfinite(opt) and opt > 0 else p.interval_s
        rows.append({"gpus": p.gpus, "interval_s": tau, "efficiency": evaluate(p, tau).efficiency})
    return rows


DEFAULT_SCALES = (8, 32, 128, 512, 1024, 2048, 4096, 8192, 16384)


# ----------------------------------------------------------------------------- validation on a run
def plan_from_summary(
    summary: dict[str, Any],
    interval_s: float | None = None,
    ckpt_interval_steps: int | None = None,
    fixed_s: float = 0.0,
) -> Plan:
    """The planner inputs measured in one run's ``summary.json`` (Contract 3, ``trainer.metrics``).

    - step time = productive_s / steps; interval = checkpoint interval in steps x step time (or
      ``interval_s``);
    - stall = mean blocked time per save (``ckpt.stall_s.mean``);
    - one tier per tier number seen, with its share of the faults and the median of its ``mttr_s``
      (fault -> first kept step after it; ``trainer.metrics`` keeps the *last* execution of each step,
      so that is the first step after the restart, and the work lost is the earlier execution of the
      recomputed steps - the model's ``recompute``, not part of the MTTR);
    - rollback ``checkpoint`` when that tier's faults restored a checkpoint or recomputed steps, else
      ``memory``;
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
    by_tier: dict[str, list[tuple[float, bool]]] = {}
    for f in incidents(summary.get("faults") or []):
        if f.get("mttr_s") is None:
            continue  # a fault the run never recovered from has no MTTR to plan with
        recomputed = int(f.get("steps_recomputed") or 0)
        recovery_s = float(f["mttr_s"])
        rolled_back = recomputed > 0 or f.get("restored_step") is not None
        by_tier.setdefault(f"tier{f.get('tier')}", []).append((recovery_s, rolled_back))
    n = sum(len(v) for v in by_tier.values())
    recovery = sum(r for v in by_tier.values() for r, _ in v)
    running = max(wall - recovery - fixed_s, productive)
    if n == 0:
        tiers: tuple[Tier, ...] = (Tier("none", 1.0, 0.0, "checkpoint"),)
    else:
        tiers = tuple(
            Tier(
                name,
                len(v) / n,
                _median([r for r, _ in v]),
                "checkpoint" if any(rb for _, rb in v) else "memory",
            )
            for name, v in sorted(by_tier.items())
        )
    # One "node" of one GPU, so that the per-GPU rate is the run's own fault rate.
    return Plan(1, 1, n / running * 3600.0, tiers, stall, interval_s)


def incidents(faults: Sequence[dict[str, Any]], window_s: float = 5.0) -> list[dict[str, Any]]:
    """Merge fault reports that are one incident: a node loss makes every rank of the node report it.
    Node-loss reports of the same step within ``window_s`` of the first become one, keeping the first
    (its MTTR runs from the earliest report). trainer.metrics' summary already merges them; this keeps
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
    the start-up and tail times, which the steady-state model does not cover. ``predicted_efficiency``
    adds those measured fixed costs to the model's wall time (``productive / model_efficiency``);
    ``model_efficiency`` is the steady-state figure alone.
    """
    path = Path(path)
    summary = json.loads(path.read_text())
    extra = run_overheads(path.parent)
    steps_interval = ckpt_interval_steps or extra.get("ckpt_interval_steps")
    fixed = float(extra.get("startup_s", 0.0)) + float(extra.get("tail_s", 0.0))
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
        "fixed_overheads_s": {k: extra[k] for k in ("startup_s", "tail_s") if k in extra},
        "faults": len(incidents(summary.get("faults") or [])),
        "plan": _plan_dict(plan),
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


def _plan_dict(plan: Plan) -> dict[str, Any]:
    d = asdict(plan)
    d["tiers"] = [asdict(t) for t in plan.tiers]
    return d


# Which bench.recovery scenario measures each default tier's MTTR.
MEASURED_SOURCES = {
    "in-process": "exception/tier1",
    "in-job": "sigkill/tier2",
    "job-restart": "exception/full",
}


def with_measured_mttrs(tiers: Sequence[Tier], recovery_result: dict[str, Any]) -> tuple[Tier, ...]:
    """``tiers`` with each MTTR replaced by the median MTTR that bench.recovery measured for it."""
    summary = recovery_result.get("summary") or {}
    out = []
    for t in tiers:
        source = MEASURED_SOURCES.get(t.name)
        spread = (summary.get(source) or {}).get("mttr_s") if source else None
        if not spread:
            raise PlanError(
                f"tier {t.name}: no measured MTTR (scenario {source or 'none'}) in the recovery result"
            )
        out.append(Tier(t.name, t.share, float(spread["median"]), t.rollback))
    return tuple(out)


# ----------------------------------------------------------------------------- CLI
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
    p = argparse.ArgumentParser(prog="python -m bench.planner", description=__doc__.split("\n")[0])
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
        "plan": _plan_dict(plan),
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


def plot_scale(plan: Plan, baseline: Plan, path: Path, scales: Sequence[int] = DEFAULT_SCALES) -> None:
    """PNG of efficiency (at each size's optimal interval) vs GPUs, tiers vs the baseline."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for label, p in (("configured tiers", plan), ("checkpoint-restart only", baseline)):
        rows = scale_sweep(p, scales)
        ax.plot([r["gpus"] for r in rows], [100 * r["efficiency"] for r in rows], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(scales), [str(g) for g in scales], rotation=45)
    ax.minorticks_off()
    ax.set_xlabel("GPUs")
    ax.set_ylabel("expected training efficiency (%)")
    ax.set_title(f"{plan.rate_per_gpu_hour:.2g} faults/GPU-h, stall {plan.stall_s:g} s, optimal interval")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.summary is not None:
            result = predict_from_summary(args.summary, args.interval)
            print(json.dumps(result, indent=2) if args.json else _format_prediction(result))
            return 0
        result = run_plan(args)
        if args.plot is not None:
            plan = Plan(**{**result["plan"], "tiers": tuple(Tier(**t) for t in result["plan"]["tiers"])})
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


if __name__ == "__main__":
    raise SystemExit(main())
