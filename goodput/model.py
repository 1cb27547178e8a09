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

``goodput.montecarlo`` simulates the same model event by event; ``tests/goodput`` checks that both agree.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Rollback = Literal["checkpoint", "memory"]
ROLLBACKS: tuple[str, ...] = ("checkpoint", "memory")


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


def plan_dict(plan: Plan) -> dict[str, Any]:
    """``plan`` as plain JSON-ready data (tiers as a list of dicts)."""
    d = asdict(plan)
    d["tiers"] = [asdict(t) for t in plan.tiers]
    return d


def plan_from_dict(d: dict[str, Any]) -> Plan:
    """The inverse of ``plan_dict`` (validated again)."""
    return Plan(**{**d, "tiers": tuple(Tier(**t) for t in d["tiers"])})
