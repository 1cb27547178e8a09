"""The Monte Carlo simulation agrees with the closed form, and tells a wrong model apart.

Tolerance: five batch-means standard errors of the simulated efficiency (the simulation's own noise at
its sample size; a seeded normal deviation beyond five is a one-in-a-million event), and that error is
itself bounded, so the check has teeth. Sample sizes keep each case under a second or two.
"""

from __future__ import annotations

import pytest

from goodput import Tier, evaluate
from goodput.montecarlo import simulate
from tests.goodput._plans import PEER_TIERS, make_plan

# A peer tier whose replica is lost often enough to count: a shared rack for 10 % of the losses and two
# peers whose own losses within 3000 s also take it (p = 0.117 here; at cluster rates it is ~1e-5).
PEER_LOSS = make_plan(
    nodes=16,
    rate_per_gpu_hour=2e-3,
    tiers=PEER_TIERS,
    interval_s=1500.0,
    snapshot_overhead=0.01,
    peer_correlated=0.1,
    rereplication_s=3000.0,
    replicas=2,
)

CASES = {
    "llama3": (make_plan(), 100_000),  # Llama 3 scale: ~94 %
    "harsh": (make_plan(rate_per_gpu_hour=5e-4, stall_s=60.0, interval_s=2000.0), 30_000),  # many rollbacks
    "tiny": (make_plan(nodes=1, rate_per_gpu_hour=1e-2, stall_s=1.0, interval_s=60.0), 100_000),
    "memory-only": (
        make_plan(tiers=(Tier("all-memory", 1.0, 45.0, "memory", 20.0),), rate_per_gpu_hour=1e-4),
        100_000,
    ),
    "restart-only": (
        make_plan(tiers=(Tier("all-restart", 1.0, 600.0, "checkpoint"),), interval_s=3000.0),
        100_000,
    ),
    "peer-loss": (PEER_LOSS, 100_000),
}


@pytest.mark.parametrize("name", list(CASES))
def test_monte_carlo_agrees_with_closed_form(name):
    plan, segments = CASES[name]
    expected = evaluate(plan)
    sim = simulate(plan, segments=segments, seed=7)
    assert sim.stderr < 0.002  # the noise is small enough for the check to mean something
    tol = 5 * sim.stderr
    assert abs(sim.efficiency - expected.efficiency) < tol
    assert abs(sim.recompute - expected.recompute) < tol
    assert abs(sim.recompute_memory - expected.recompute_memory) < tol
    assert abs(sim.snapshot - expected.snapshot) < tol
    for tier, share in expected.recovery.items():
        assert abs(sim.recovery[tier] - share) < tol


def test_simulated_replica_losses_match_the_closed_form_probability():
    # The simulation draws each peer fault's shared-rack loss and its peers' last loss; the fraction that
    # lost the replica must match p = 1 - (1 - q) exp(-r lam_node W) within a binomial 5 sigma.
    sim = simulate(PEER_LOSS, segments=100_000, seed=3)
    peer_share = sum(t.share for t in PEER_LOSS.tiers if t.rollback == "peer")
    n = sim.faults * peer_share
    p = PEER_LOSS.peer_loss_probability
    assert 0.1 < p < 0.2
    assert abs(sim.peer_losses / n - p) < 5 * (p * (1 - p) / n) ** 0.5


def test_monte_carlo_detects_a_wrong_model():
    # Counting in-process faults as rollbacks must move the simulated efficiency by more than the tolerance
    # at a harsh rate, so the agreement above is not a coincidence of small numbers.
    plan = make_plan(rate_per_gpu_hour=5e-4, stall_s=60.0, interval_s=2000.0)
    wrong = plan.with_(tiers=tuple(Tier(t.name, t.share, t.mttr_s, "checkpoint") for t in plan.tiers))
    sim = simulate(wrong, segments=4_000)
    assert abs(sim.efficiency - evaluate(plan).efficiency) > 10 * sim.stderr


def test_monte_carlo_detects_a_model_without_replica_losses():
    # A closed form that ignored losing node and replica together (p = 0) is off by many standard errors.
    sim = simulate(PEER_LOSS, segments=100_000, seed=11)
    blind = evaluate(PEER_LOSS.with_(peer_correlated=0.0, rereplication_s=0.0))
    assert abs(sim.efficiency - blind.efficiency) > 10 * sim.stderr
