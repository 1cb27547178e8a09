"""The Monte Carlo simulation agrees with the closed form, and tells a wrong model apart."""

from __future__ import annotations

import pytest

from goodput import Tier, evaluate
from goodput.montecarlo import simulate
from tests.goodput._plans import make_plan


@pytest.mark.parametrize(
    "plan",
    [
        make_plan(),  # Llama 3 scale: ~94 %
        make_plan(rate_per_gpu_hour=5e-4, stall_s=60.0, interval_s=2000.0),  # harsh: ~55 %, many rollbacks
        make_plan(nodes=1, rate_per_gpu_hour=1e-2, stall_s=1.0, interval_s=60.0),  # tiny, frequent faults
        make_plan(tiers=(Tier("all-memory", 1.0, 45.0, "memory"),), rate_per_gpu_hour=1e-4),
        make_plan(tiers=(Tier("all-restart", 1.0, 600.0, "checkpoint"),), interval_s=3000.0),
    ],
    ids=["llama3", "harsh", "tiny", "memory-only", "restart-only"],
)
def test_monte_carlo_agrees_with_closed_form_within_half_a_point(plan):
    expected = evaluate(plan)
    sim = simulate(plan, segments=300_000, seed=7)
    assert abs(sim.efficiency - expected.efficiency) < 0.005
    # The simulation's own noise is well below the tolerance, so the check has teeth.
    assert sim.stderr < 0.001
    assert abs(sim.recompute - expected.recompute) < 0.005
    for name, share in expected.recovery.items():
        assert abs(sim.recovery[name] - share) < 0.005


def test_monte_carlo_detects_a_wrong_model():
    # Counting in-process faults as rollbacks must move the simulated efficiency by more than the tolerance
    # at a harsh rate, so the agreement above is not a coincidence of small numbers.
    plan = make_plan(rate_per_gpu_hour=5e-4, stall_s=60.0, interval_s=2000.0)
    wrong = plan.with_(tiers=tuple(Tier(t.name, t.share, t.mttr_s, "checkpoint") for t in plan.tiers))
    assert abs(simulate(wrong, segments=50_000).efficiency - evaluate(plan).efficiency) > 0.01
