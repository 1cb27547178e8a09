"""Monte Carlo simulation of the planner's model, event by event (numpy, seeded).

It does not use the closed form: each segment of ``interval + stall`` running seconds is driven fault
by fault - draw the running time to the next fault (all tiers together), pick the tier by its share,
charge its MTTR, and either roll the segment back to its start (``checkpoint``) or carry on where it
stopped (``memory``) - until it completes. Efficiency is total productive time over total wall time;
its standard error comes from batch means.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from goodput.model import Plan, PlanError


@dataclass(frozen=True)
class Simulated:
    """The simulated efficiency, its standard error and the lost-time breakdown (fractions)."""

    efficiency: float
    stderr: float
    stall: float
    recompute: float
    recovery: dict[str, float]
    faults: int


def simulate(
    plan: Plan,
    interval_s: float | None = None,
    segments: int = 200_000,
    seed: int = 0,
    batches: int = 20,
    max_rounds: int = 100_000,
) -> Simulated:
    """Simulate ``segments`` checkpoint segments of ``plan`` and measure its efficiency."""
    tau = plan.interval_s if interval_s is None else interval_s
    if not tau > 0:
        raise PlanError(f"interval_s must be > 0, got {tau}")
    if segments < batches or batches < 2:
        raise PlanError(f"segments must be >= batches >= 2, got segments={segments}, batches={batches}")
    rng = np.random.default_rng(seed)
    seg = tau + plan.stall_s
    lam = plan.fault_rate_s
    shares = np.array([t.share for t in plan.tiers])
    mttr = np.array([t.mttr_s for t in plan.tiers])
    rolls_back = np.array([t.rollback == "checkpoint" for t in plan.tiers])

    progress = np.zeros(segments)  # running seconds into the current segment since its last rollback
    wall = np.zeros(segments)
    recompute = np.zeros(segments)
    recovery = np.zeros((segments, len(plan.tiers)))
    active = np.arange(segments)
    faults = 0
    for _ in range(max_rounds):
        if active.size == 0:
            break
        gap = rng.exponential(1.0 / lam, active.size) if lam > 0 else np.full(active.size, np.inf)
        remaining = seg - progress[active]
        finish = gap >= remaining
        wall[active[finish]] += remaining[finish]
        hit, g = active[~finish], gap[~finish]
        wall[hit] += g
        progress[hit] += g
        tier = rng.choice(len(plan.tiers), size=hit.size, p=shares)
        wall[hit] += mttr[tier]
        np.add.at(recovery, (hit, tier), mttr[tier])
        back = rolls_back[tier]
        recompute[hit[back]] += progress[hit[back]]
        progress[hit[back]] = 0.0
        faults += hit.size
        active = hit
    else:
        raise PlanError(f"simulation did not finish in {max_rounds} rounds: the fault rate is too high")

    total = wall.sum()
    per_batch = np.array([tau * len(b) / wall[b].sum() for b in np.array_split(np.arange(segments), batches)])
    return Simulated(
        efficiency=tau * segments / total,
        stderr=float(per_batch.std(ddof=1) / np.sqrt(batches)),
        stall=plan.stall_s * segments / total,
        recompute=float(recompute.sum() / total),
        recovery={t.name: float(recovery[:, i].sum() / total) for i, t in enumerate(plan.tiers)},
        faults=faults,
    )
