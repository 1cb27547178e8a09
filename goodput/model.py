"""Goodput planner: expected training efficiency and the best checkpoint interval at cluster scale.

The model
---------
A job runs on ``G = nodes * gpus_per_node`` GPUs. Faults arrive as a Poisson process with rate
``lam = G * rate_per_gpu_hour / 3600`` per second of *running* time (computing, snapshotting or blocked
in a checkpoint save); no fault arrives while the job is recovering. Each fault is handled by exactly one
tier ``k``, chosen independently with probability ``share_k`` (shares sum to 1). Tier ``k`` costs
``mttr_k`` seconds of wall time (fault -> first productive step after it: detection, teardown,
restart, reload) and rolls the job back

* to the last durable checkpoint (``rollback="checkpoint"``): the work done since that checkpoint is
  lost and recomputed;
* to its last in-memory snapshot (``rollback="memory"``: the process's own memory or the pod's
  /dev/shm): ``rollback_s`` seconds of work are recomputed (the steps since the snapshot plus the step
  in flight; measured as steps, times the step time), whatever the checkpoint interval;
* to a replica of its snapshot on a peer node (``rollback="peer"``, a lost node): like ``memory``,
  unless the node and the peer(s) holding its replica were lost together before the replica was
  rebuilt - then to the durable checkpoint (and ``fallback_mttr_s`` instead of ``mttr_s``).

Losing the replica (``peer`` tiers only) has probability

    p = 1 - (1 - peer_correlated) * exp(-replicas * lam_node * rereplication_s)

``peer_correlated`` is the chance that one event takes the node and its replica peer together (a rack,
switch or power domain shared by the pair); the exponential term is the chance that none of the
``replicas`` nodes holding the replica was itself lost in the ``rereplication_s`` seconds before (the
window in which a lost node's state exists on one side only), with ``lam_node = lam * share_peer /
nodes`` the rate at which one given node is lost. Both are independent of the fault history, so the
peer tier splits into a memory part (``1 - p``) and a checkpoint part (``p``).

Snapshots block the loop for ``snapshot_overhead`` seconds per second of productive compute (blocked
time per snapshot / (snapshot interval in steps x step time)); the job saves a durable checkpoint after
every ``interval`` seconds of productive compute; each save blocks training for ``stall`` seconds; a
checkpoint is durable once its stall ends (the model ignores the commit latency of the background
write of an async save: a fault inside that window would roll back one checkpoint further). A fault
during the stall loses the save. The recompute after a memory rollback is charged like its MTTR, as
time in which no fault arrives (it is at most a few steps; faults are hours apart).

Because faults are memoryless, the run is a renewal process over *segments* of ``T = interval * (1 +
snapshot_overhead) + stall`` running seconds between durable checkpoints. Split the faults into
rollback faults (rate ``lam_r = lam * (sum of checkpoint shares + sum of peer shares * p)``) and memory
faults (rate ``lam_m = lam - lam_r``). The running time spent to get one segment through is the classic
restart-from-scratch result ``E[run] = expm1(lam_r T) / lam_r``; the expected number of rollback faults
in it is ``expm1(lam_r T)``; memory faults hit that running time at rate ``lam_m``. So, exactly within
the model::

    E[wall per segment] = E[run] + expm1(lam_r T) * Rr + lam_m * E[run] * (Rm + Lm)
                        = expm1(lam_r T) * ((1 + lam_m (Rm + Lm)) / lam_r + Rr)
    efficiency          = interval / E[wall per segment]

with ``Rr`` and ``Rm`` the share-weighted mean MTTRs of the rollback and the memory faults and ``Lm``
the share-weighted mean ``rollback_s`` of the memory faults. The lost time splits into the stall of
the durable save, the snapshots' blocked time, recompute after checkpoint rollbacks (``E[run] - T``:
work and aborted saves rolled back), recompute after memory rollbacks, and recovery per tier.

Optimal interval: ``wall / interval`` is ``C * expm1(lam_r ((1 + f) tau + stall)) / tau`` with ``C``
independent of ``tau`` and ``f`` the snapshot overhead, so the optimum depends only on the rollback
fault rate, the stall and ``f`` - faults handled from memory never call for more checkpoints. With ``u =
lam_r (1 + f) tau`` the derivative is zero where ``exp(lam_r stall) * exp(u) * (1 - u) = 1``, which
has one root in (0, 1); we solve it by bisection (the "exact" optimum; it equals ``(1 + W0(-exp(-1 -
lam_r stall))) / (lam_r (1 + f))``). The first-order Young/Daly interval is ``sqrt(2 * stall *
MTBF_r) / (1 + f)`` with ``MTBF_r = 1 / lam_r``.

``goodput.montecarlo`` simulates the same model event by event (drawing the peers' losses rather than
using ``p``); ``tests/goodput`` checks that both agree.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Rollback = Literal["checkpoint", "memory", "peer"]
ROLLBACKS: tuple[str, ...] = ("checkpoint", "memory", "peer")


class PlanError(ValueError):
    """An invalid planner input; the message names the field."""


def _finite_nonneg(value: float) -> bool:
    return value >= 0.0 and not math.isinf(value)  # False for nan too


@dataclass(frozen=True)
class Tier:
    """One recovery tier: the share of faults it handles, its MTTR and where it rolls back to."""

    name: str
    share: float
    """Fraction of all faults this tier handles, in [0, 1]."""
    mttr_s: float
    """Seconds from the fault to the first productive step after it."""
    rollback: Rollback = "checkpoint"
    """``checkpoint``: recompute since the last checkpoint; ``memory``: recompute ``rollback_s`` from a
    snapshot; ``peer``: as ``memory`` from a peer's replica, else (replica lost) as ``checkpoint``."""
    rollback_s: float = 0.0
    """Seconds of work recomputed per fault of a ``memory`` or ``peer`` tier (steps lost x step time)."""
    fallback_mttr_s: float | None = None
    """MTTR of a ``peer`` fault whose replica was lost (restore from the durable checkpoint); None:
    ``mttr_s``."""

    def __post_init__(self) -> None:
        if not self.name:
            raise PlanError("tier.name must not be empty")
        if not 0.0 <= self.share <= 1.0 or math.isnan(self.share):
            raise PlanError(f"tier {self.name}: share must be in [0, 1], got {self.share}")
        if not _finite_nonneg(self.mttr_s):
            raise PlanError(f"tier {self.name}: mttr_s must be a finite number >= 0, got {self.mttr_s}")
        if self.rollback not in ROLLBACKS:
            raise PlanError(f"tier {self.name}: rollback must be one of {ROLLBACKS}, got {self.rollback!r}")
        if not _finite_nonneg(self.rollback_s):
            raise PlanError(f"tier {self.name}: rollback_s must be finite and >= 0, got {self.rollback_s}")
        if self.rollback == "checkpoint" and self.rollback_s:
            raise PlanError(
                f"tier {self.name}: rollback_s applies to memory and peer tiers only (a checkpoint "
                "rollback follows from the interval)"
            )
        if self.fallback_mttr_s is not None:
            if self.rollback != "peer":
                raise PlanError(f"tier {self.name}: fallback_mttr_s applies to peer tiers only")
            if not _finite_nonneg(self.fallback_mttr_s):
                raise PlanError(
                    f"tier {self.name}: fallback_mttr_s must be finite and >= 0, got {self.fallback_mttr_s}"
                )

    @property
    def checkpoint_mttr_s(self) -> float:
        """MTTR when this tier rolls back to the durable checkpoint."""
        return self.mttr_s if self.fallback_mttr_s is None else self.fallback_mttr_s


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
    snapshot_overhead: float = 0.0
    """Seconds the loop is blocked by snapshots per second of productive compute."""
    peer_correlated: float = 0.0
    """Probability that the event that loses a node also loses the peer(s) holding its replica."""
    rereplication_s: float = 0.0
    """Seconds after a node loss during which the state it replicated exists on one node only."""
    replicas: int = 1
    """Peer nodes holding a replica of each node's snapshot."""

    def __post_init__(self) -> None:
        if self.nodes < 1:
            raise PlanError(f"nodes must be >= 1, got {self.nodes}")
        if self.gpus_per_node < 1:
            raise PlanError(f"gpus_per_node must be >= 1, got {self.gpus_per_node}")
        if not _finite_nonneg(self.rate_per_gpu_hour):
            raise PlanError(f"rate_per_gpu_hour must be a finite number >= 0, got {self.rate_per_gpu_hour}")
        if not self.tiers:
            raise PlanError("tiers must name at least one tier")
        names = [t.name for t in self.tiers]
        if len(set(names)) != len(names):
            raise PlanError(f"tiers: names must be unique, got {names}")
        total = sum(t.share for t in self.tiers)
        if abs(total - 1.0) > 1e-6:
            raise PlanError(f"tiers: shares must sum to 1, got {total:.6g}")
        if not _finite_nonneg(self.stall_s):
            raise PlanError(f"stall_s must be a finite number >= 0, got {self.stall_s}")
        if not self.interval_s > 0.0 or math.isinf(self.interval_s):
            raise PlanError(f"interval_s must be a finite number > 0, got {self.interval_s}")
        if not _finite_nonneg(self.snapshot_overhead):
            raise PlanError(f"snapshot_overhead must be a finite number >= 0, got {self.snapshot_overhead}")
        if not 0.0 <= self.peer_correlated <= 1.0 or math.isnan(self.peer_correlated):
            raise PlanError(f"peer_correlated must be in [0, 1], got {self.peer_correlated}")
        if not _finite_nonneg(self.rereplication_s):
            raise PlanError(f"rereplication_s must be a finite number >= 0, got {self.rereplication_s}")
        if self.replicas < 1:
            raise PlanError(f"replicas must be >= 1, got {self.replicas}")

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def fault_rate_s(self) -> float:
        """Job-wide faults per second of running time."""
        return self.gpus * self.rate_per_gpu_hour / 3600.0

    @property
    def node_loss_rate_s(self) -> float:
        """Losses of one given node per second: the peer tiers' faults, spread over the nodes."""
        return self.fault_rate_s * sum(t.share for t in self.tiers if t.rollback == "peer") / self.nodes

    @property
    def peer_loss_probability(self) -> float:
        """Probability that a peer-tier fault finds its replica gone (see the module docstring)."""
        survive = math.exp(-self.replicas * self.node_loss_rate_s * self.rereplication_s)
        return 1.0 - (1.0 - self.peer_correlated) * survive

    def checkpoint_fraction(self, tier: Tier) -> float:
        """Fraction of ``tier``'s faults that roll back to the durable checkpoint."""
        return {"checkpoint": 1.0, "memory": 0.0, "peer": self.peer_loss_probability}[tier.rollback]

    @property
    def rollback_rate_s(self) -> float:
        """Faults per running second that roll back to the last checkpoint."""
        return self.fault_rate_s * sum(t.share * self.checkpoint_fraction(t) for t in self.tiers)

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
    """Recompute after checkpoint rollbacks (work since the checkpoint, aborted saves)."""
    recovery: dict[str, float] = field(default_factory=dict)
    wall_per_segment_s: float = 0.0
    faults_per_segment: float = 0.0
    snapshot: float = 0.0
    """Time the snapshots block the loop."""
    recompute_memory: float = 0.0
    """Recompute after memory and peer rollbacks (``rollback_s`` per fault)."""

    def lost(self) -> dict[str, float]:
        """Lost time by cause, as fractions of wall time."""
        return {
            "stall": self.stall,
            "snapshot": self.snapshot,
            "recompute": self.recompute,
            "recompute:memory": self.recompute_memory,
        } | {f"recovery:{name}": v for name, v in self.recovery.items()}


def evaluate(plan: Plan, interval_s: float | None = None) -> Outcome:
    """Expected efficiency and lost-time breakdown of ``plan`` (at ``interval_s`` if given)."""
    tau = plan.interval_s if interval_s is None else interval_s
    if not tau > 0:
        raise PlanError(f"interval_s must be > 0, got {tau}")
    lam = plan.fault_rate_s
    lam_r = plan.rollback_rate_s
    snap = tau * plan.snapshot_overhead
    seg = tau + snap + plan.stall_s
    x = lam_r * seg
    if x > 700.0:  # exp overflows: the job essentially never completes a segment
        return Outcome(0.0, 0.0, 1.0, {t.name: 0.0 for t in plan.tiers}, math.inf, math.inf)
    rollbacks = math.expm1(x)  # expected rollback faults per segment
    run = rollbacks / lam_r if lam_r > 0 else seg  # expected running time per segment
    recovery_s: dict[str, float] = {}
    redo_s = 0.0
    for tier in plan.tiers:
        c = plan.checkpoint_fraction(tier)
        # This tier's rollback faults per segment are its share of all rollback faults; its memory
        # faults hit the running time at its memory rate.
        n_ckpt = rollbacks * tier.share * c * lam / lam_r if lam_r > 0 else 0.0
        n_mem = lam * tier.share * (1.0 - c) * run
        recovery_s[tier.name] = n_ckpt * tier.checkpoint_mttr_s + n_mem * tier.mttr_s
        redo_s += n_mem * tier.rollback_s
    wall = run + sum(recovery_s.values()) + redo_s
    return Outcome(
        efficiency=tau / wall,
        stall=plan.stall_s / wall,
        recompute=(run - seg) / wall,
        recovery={k: v / wall for k, v in recovery_s.items()},
        wall_per_segment_s=wall,
        faults_per_segment=lam * run,
        snapshot=snap / wall,
        recompute_memory=redo_s / wall,
    )


def young_daly_interval(plan: Plan) -> float:
    """First-order optimum ``sqrt(2 * stall * MTBF) / (1 + f)`` over the faults that roll back (inf if
    none)."""
    lam_r = plan.rollback_rate_s
    if lam_r == 0.0:
        return math.inf
    return math.sqrt(2.0 * plan.stall_s / lam_r) / (1.0 + plan.snapshot_overhead)


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
    return 0.5 * (lo + hi) / (lam_r * (1.0 + plan.snapshot_overhead))


def checkpoint_restart_baseline(plan: Plan, mttr_s: float, stall_s: float | None = None) -> Plan:
    """The same job with one tier only and no snapshots: every fault restarts the whole job from the
    last checkpoint."""
    return plan.with_(
        tiers=(Tier("job-restart", 1.0, mttr_s, "checkpoint"),),
        stall_s=plan.stall_s if stall_s is None else stall_s,
        snapshot_overhead=0.0,
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
