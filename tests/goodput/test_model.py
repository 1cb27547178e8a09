"""The planner's closed form: the Llama 3 profile, the breakdown, the optimum, scale, input checks."""

from __future__ import annotations

import math

import pytest

import goodput
from goodput import PlanError, Tier, evaluate, optimal_interval, young_daly_interval
from tests.goodput._plans import make_plan


def test_llama3_profile_is_419_interruptions_in_54_days_on_16k_gpus():
    plan = make_plan()
    faults_in_54_days = plan.fault_rate_s * 54 * 86400
    assert faults_in_54_days == pytest.approx(419)


def test_breakdown_adds_up_to_wall_time():
    out = evaluate(make_plan(rate_per_gpu_hour=1e-4))
    assert out.efficiency + sum(out.lost().values()) == pytest.approx(1.0)


def test_without_faults_only_the_stall_is_lost():
    out = evaluate(make_plan(rate_per_gpu_hour=0.0, stall_s=5.0, interval_s=95.0))
    assert out.efficiency == pytest.approx(0.95)
    assert optimal_interval(make_plan(rate_per_gpu_hour=0.0)) == math.inf


def test_exact_optimum_is_the_maximum_and_near_young_daly_when_faults_are_rare():
    plan = make_plan()
    opt = optimal_interval(plan)
    best = evaluate(plan, opt).efficiency
    for factor in (0.8, 0.95, 1.05, 1.25):
        assert evaluate(plan, opt * factor).efficiency < best
    assert opt == pytest.approx(young_daly_interval(plan), rel=0.03)
    # Where stall is a large part of the MTBF the first-order formula drifts off the optimum.
    harsh = make_plan(rate_per_gpu_hour=5e-3, stall_s=120.0)
    assert abs(optimal_interval(harsh) / young_daly_interval(harsh) - 1) > 0.1
    assert (
        evaluate(harsh, optimal_interval(harsh)).efficiency
        > evaluate(harsh, young_daly_interval(harsh)).efficiency
    )


def test_memory_tiers_do_not_change_the_optimal_interval():
    a = make_plan(tiers=(Tier("mem", 0.5, 10.0, "memory"), Tier("ckpt", 0.5, 100.0, "checkpoint")))
    b = a.with_(rate_per_gpu_hour=a.rate_per_gpu_hour / 2, tiers=(Tier("ckpt", 1.0, 100.0, "checkpoint"),))
    assert optimal_interval(a) == pytest.approx(optimal_interval(b))


def test_tiers_beat_checkpoint_restart_only_and_efficiency_falls_with_scale():
    plan = make_plan()
    base = goodput.checkpoint_restart_baseline(plan, 900.0)
    tiers = goodput.scale_sweep(plan, goodput.DEFAULT_SCALES)
    restart = goodput.scale_sweep(base, goodput.DEFAULT_SCALES)
    effs = [r["efficiency"] for r in tiers]
    assert effs == sorted(effs, reverse=True)
    assert all(t["efficiency"] > b["efficiency"] for t, b in zip(tiers, restart, strict=True))


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"nodes": 0}, "nodes"),
        ({"rate_per_gpu_hour": -1.0}, "rate_per_gpu_hour"),
        ({"stall_s": -1.0}, "stall_s"),
        ({"interval_s": 0.0}, "interval_s"),
        ({"tiers": (Tier("a", 0.5, 1.0),)}, "shares must sum to 1"),
        ({"tiers": (Tier("a", 0.5, 1.0), Tier("a", 0.5, 1.0))}, "unique"),
    ],
)
def test_invalid_inputs_name_the_field(kw, field):
    with pytest.raises(PlanError, match=field):
        make_plan(**kw)
