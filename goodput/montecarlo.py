"""Monte Carlo simulation of the planner's model, event by event (numpy, seeded).

It does not use the closed form: each segment of ``interval * (1 + snapshot_overhead) + stall`` running
seconds is driven fault by fault - draw the running time to the next fault (all tiers together), pick
the tier by its share, and either roll the segment back to its start (``checkpoint``) or charge the
tier's ``rollback_s`` of recompute and carry on where it stopped (``memory``) - until it completes. A
``peer`` fault draws whether its replica survived: one Bernoulli draw for a loss shared with its peer
(``peer_correlated``), and the time back to the last loss among its ``replicas`` peers (exponential at
their combined node-loss rate, which a Poisson process's backward recurrence time is); a loss within
``rereplication_s`` took the replica, and the fault rolls back to the checkpoint with the tier's
fallback MTTR. Efficiency is total productive time over total wall time; its standard error comes from
batch means.
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
    snapshot: float = 0.0
    recompute_memory: float = 0.0
    peer_losses: int = 0
    """Peer-tier faults whose replica was gone (rolled back to the checkpoint)."""


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
    seg = tau * (1.0 + plan.snapshot_overhead) + plan.stall_s
    lam = plan.fault_rate_s
    shares = np.array([t.share for t in plan.tiers])
    mttr = np.array([t.mttr_s for t in plan.tiers])
    fallback_mttr = np.array([t.checkpoint_mttr_s for t in plan.tiers])
    redo = np.array([t.rollback_s for t in plan.tiers])
    always_back = np.array([t.rollback == "checkpoint" for t in plan.tiers])
    is_peer = np.array([t.rollback == "peer" for t in plan.tiers])
    peers_rate = plan.replicas * plan.node_loss_rate_s  # losses per second among one node's peers

    progress = np.zeros(segments)  # running seconds into the current segment since its last rollback
    wall = np.zeros(segments)
    recompute = np.zeros(segments)
    recovery = np.zeros((segments, len(plan.tiers)))
    redone = np.zeros(segments)
    active = np.arange(segments)
    faults = peer_losses = 0
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
        lost = _replica_lost(rng, hit.size, plan.peer_correlated, peers_rate, plan.rereplication_s)
        lost &= is_peer[tier]
        back = always_back[tier] | lost
        cost = np.where(lost, fallback_mttr[tier], mttr[tier])
        wall[hit] += cost
        np.add.at(recovery, (hit, tier), cost)
        mem = hit[~back]
        wall[mem] += redo[tier[~back]]
        redone[mem] += redo[tier[~back]]
        recompute[hit[back]] += progress[hit[back]]
        progress[hit[back]] = 0.0
        faults += hit.size
        peer_losses += int(lost.sum())
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
        snapshot=tau * plan.snapshot_overhead * segments / total,
        recompute_memory=float(redone.sum() / total),
        peer_losses=peer_losses,
    )


def _replica_lost(
    rng: np.random.Generator, n: int, correlated: float, peers_rate: float, window_s: float
) -> np.ndarray:
    """For ``n`` node losses: was the replica gone too (lost with its peer, or a peer lost within the
    re-replication window before)?"""
    together = rng.random(n) < correlated
    if peers_rate > 0.0 and window_s > 0.0:
        since_peer_loss = rng.exponential(1.0 / peers_rate, n)
        together |= since_peer_loss < window_s
    return together
