"""The goodput planner: closed form vs Monte Carlo, optimum, validation, CLI."""

from __future__ import annotations

import json
import math

import pytest

from bench import planner
from bench.montecarlo import simulate
from bench.planner import Plan, PlanError, Tier, evaluate, optimal_interval, young_daly_interval

LLAMA3 = planner.PROFILES["llama3-405b"][0]
TIERS = (
    Tier("in-process", 0.3, 30.0, "memory"),
    Tier("in-job", 0.5, 120.0, "checkpoint"),
    Tier("job-restart", 0.2, 900.0, "checkpoint"),
)


def _plan(**kw):
    base = {
        "nodes": 2048,
        "gpus_per_node": 8,
        "rate_per_gpu_hour": LLAMA3,
        "tiers": TIERS,
        "stall_s": 10.0,
        "interval_s": 600.0,
    }
    base.update(kw)
    return Plan(**base)


def test_llama3_profile_is_419_interruptions_in_54_days_on_16k_gpus():
    plan = _plan()
    faults_in_54_days = plan.fault_rate_s * 54 * 86400
    assert faults_in_54_days == pytest.approx(419)


@pytest.mark.parametrize(
    "plan",
    [
        _plan(),  # Llama 3 scale: ~94 %
        _plan(rate_per_gpu_hour=5e-4, stall_s=60.0, interval_s=2000.0),  # harsh: ~55 %, many rollbacks
        _plan(nodes=1, rate_per_gpu_hour=1e-2, stall_s=1.0, interval_s=60.0),  # tiny, frequent faults
        _plan(tiers=(Tier("all-memory", 1.0, 45.0, "memory"),), rate_per_gpu_hour=1e-4),
        _plan(tiers=(Tier("all-restart", 1.0, 600.0, "checkpoint"),), interval_s=3000.0),
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
    plan = _plan(rate_per_gpu_hour=5e-4, stall_s=60.0, interval_s=2000.0)
    wrong = plan.with_(tiers=tuple(Tier(t.name, t.share, t.mttr_s, "checkpoint") for t in plan.tiers))
    assert abs(simulate(wrong, segments=50_000).efficiency - evaluate(plan).efficiency) > 0.01


def test_breakdown_adds_up_to_wall_time():
    out = evaluate(_plan(rate_per_gpu_hour=1e-4))
    assert out.efficiency + sum(out.lost().values()) == pytest.approx(1.0)


def test_without_faults_only_the_stall_is_lost():
    out = evaluate(_plan(rate_per_gpu_hour=0.0, stall_s=5.0, interval_s=95.0))
    assert out.efficiency == pytest.approx(0.95)
    assert optimal_interval(_plan(rate_per_gpu_hour=0.0)) == math.inf


def test_exact_optimum_is_the_maximum_and_near_young_daly_when_faults_are_rare():
    plan = _plan()
    opt = optimal_interval(plan)
    best = evaluate(plan, opt).efficiency
    for factor in (0.8, 0.95, 1.05, 1.25):
        assert evaluate(plan, opt * factor).efficiency < best
    assert opt == pytest.approx(young_daly_interval(plan), rel=0.03)
    # Where stall is a large part of the MTBF the first-order formula drifts off the optimum.
    harsh = _plan(rate_per_gpu_hour=5e-3, stall_s=120.0)
    assert abs(optimal_interval(harsh) / young_daly_interval(harsh) - 1) > 0.1
    assert (
        evaluate(harsh, optimal_interval(harsh)).efficiency
        > evaluate(harsh, young_daly_interval(harsh)).efficiency
    )


def test_memory_tiers_do_not_change_the_optimal_interval():
    a = _plan(tiers=(Tier("mem", 0.5, 10.0, "memory"), Tier("ckpt", 0.5, 100.0, "checkpoint")))
    b = a.with_(rate_per_gpu_hour=a.rate_per_gpu_hour / 2, tiers=(Tier("ckpt", 1.0, 100.0, "checkpoint"),))
    assert optimal_interval(a) == pytest.approx(optimal_interval(b))


def test_tiers_beat_checkpoint_restart_only_and_efficiency_falls_with_scale():
    plan = _plan()
    base = planner.checkpoint_restart_baseline(plan, 900.0)
    tiers = planner.scale_sweep(plan, planner.DEFAULT_SCALES)
    restart = planner.scale_sweep(base, planner.DEFAULT_SCALES)
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
        _plan(**kw)


def test_tier_spec_parsing():
    tier = planner.parse_tier("in-job:share=0.5:mttr=12.5:rollback=memory")
    assert tier == Tier("in-job", 0.5, 12.5, "memory")
    with pytest.raises(PlanError, match="rollback"):
        planner.parse_tier("x:share=1:mttr=1:rollback=disk")
    with pytest.raises(PlanError, match="mttr"):
        planner.parse_tier("x:share=1")


def _summary(faults, efficiency=0.8):
    # The shape trainer.metrics.summarize writes.
    return {
        "steps": 100,
        "wall_s": 125.0,
        "productive_s": 100.0,
        "training_efficiency": efficiency,
        "ckpt": {"saves": 10, "stall_s": {"mean": 0.5, "median": 0.5}},
        "faults": faults,
    }


def test_plan_from_summary_uses_the_runs_measured_parameters():
    faults = [
        {"type": "exception", "tier": 1, "mttr_s": 2.0, "steps_recomputed": 0, "restored_step": None},
        {"type": "sigkill", "tier": 2, "mttr_s": 8.0, "steps_recomputed": 4, "restored_step": 9},
        {"type": "hang", "tier": 2, "mttr_s": 12.0, "steps_recomputed": 6, "restored_step": 19},
        {"type": "hang", "tier": 2, "mttr_s": None, "steps_recomputed": None, "restored_step": None},
    ]
    plan = planner.plan_from_summary(_summary(faults), ckpt_interval_steps=10)
    assert plan.interval_s == pytest.approx(10.0)  # 10 steps x 1 s
    assert plan.stall_s == pytest.approx(0.5)
    by_name = {t.name: t for t in plan.tiers}
    assert by_name["tier1"] == Tier("tier1", 1 / 3, 2.0, "memory")
    assert by_name["tier2"] == Tier("tier2", 2 / 3, 10.0, "checkpoint")
    assert plan.fault_rate_s == pytest.approx(3 / (125.0 - 22.0))
    with pytest.raises(PlanError, match="ckpt_interval_steps"):
        planner.plan_from_summary(_summary(faults))


def _write_run(tmp_path, summary, interval=10):
    (tmp_path / "summary.json").write_text(json.dumps(summary))
    events = [
        {"ev": "run_start", "t": 0.0, "rank": 0, "config": {"ckpt": {"interval_steps": interval}}},
        {"ev": "step", "t": 3.0, "rank": 0, "step": 0, "t_start": 2.0, "t_end": 3.0},
        {"ev": "step", "t": 122.0, "rank": 0, "step": 99, "t_start": 121.0, "t_end": 122.0},
        {"ev": "run_end", "t": 125.0, "rank": 0},
    ]
    (tmp_path / "events.rank0.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events) + "{torn")
    return tmp_path / "summary.json"


def test_predict_from_summary_adds_measured_fixed_costs(tmp_path):
    path = _write_run(tmp_path, _summary([{"tier": 2, "mttr_s": 5.0, "steps_recomputed": 5}], 0.8))
    result = planner.predict_from_summary(path)
    assert result["fixed_overheads_s"] == {"startup_s": 2.0, "tail_s": 3.0}
    model = result["model_efficiency"]
    assert result["predicted_efficiency"] == pytest.approx(100.0 / (100.0 / model + 5.0))
    assert result["difference_pp"] == pytest.approx(100 * (result["predicted_efficiency"] - 0.8))
    assert result["plan"]["interval_s"] == pytest.approx(10.0)
    # The fault rate is per second of running time: start-up, tail and recovery are not running.
    assert result["plan"]["rate_per_gpu_hour"] == pytest.approx(3600 / (125.0 - 5.0 - 5.0))
    with pytest.raises(PlanError, match="wall_s"):
        planner.plan_from_summary({"steps": 1})


def test_prediction_on_a_synthetic_run_with_known_costs(tmp_path):
    # 100 s of steps, 10 saves of 0.5 s, one rollback fault with 5 s recovery and 5 s recompute, 5 s fixed:
    # the measured wall is 120 s. The model's expected recompute for one fault is half a segment here, so
    # the prediction must land close to the measured 100/120.
    summary = _summary([{"tier": 2, "mttr_s": 5.0, "steps_recomputed": 5, "restored_step": 44}], 100 / 120)
    summary["wall_s"] = 120.0
    result = planner.predict_from_summary(_write_run(tmp_path, summary))
    assert abs(result["difference_pp"]) < 2.0


def test_cli_prints_plan_and_writes_plot(tmp_path, capsys):
    png = tmp_path / "scale.png"
    rc = planner.main(
        ["--nodes", "128", "--profile", "llama3-405b", "--stall", "5", "--json", "--plot", str(png)]
    )
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["gpus"] == 1024
    assert out["efficiency"] > out["baseline"]["efficiency"]
    assert out["interval_optimal_s"] == pytest.approx(out["plan"]["interval_s"])
    assert png.stat().st_size > 10_000
    assert planner.main(["--tier", "a:share=0.4:mttr=1"]) == 2
    assert "shares must sum to 1" in capsys.readouterr().err


def test_measured_mttrs_come_from_the_recovery_bench(tmp_path, capsys):
    rec = {
        "summary": {
            "exception/tier1": {"mttr_s": {"median": 1.5, "min": 1.0, "max": 2.0, "n": 3}},
            "sigkill/tier2": {"mttr_s": {"median": 6.0, "min": 5.0, "max": 7.0, "n": 3}},
            "exception/full": {"mttr_s": {"median": 12.0, "min": 11.0, "max": 14.0, "n": 3}},
        }
    }
    tiers = planner.with_measured_mttrs(TIERS, rec)
    assert [t.mttr_s for t in tiers] == [1.5, 6.0, 12.0]
    assert [t.share for t in tiers] == [t.share for t in TIERS]
    del rec["summary"]["sigkill/tier2"]
    with pytest.raises(PlanError, match="in-job"):
        planner.with_measured_mttrs(TIERS, rec)
    rec["summary"]["sigkill/tier2"] = {"mttr_s": {"median": 6.0}}
    path = tmp_path / "recovery.json"
    path.write_text(json.dumps(rec))
    assert planner.main(["--measured", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [t["mttr_s"] for t in out["plan"]["tiers"]] == [1.5, 6.0, 12.0]


def test_a_node_loss_reported_by_each_rank_is_one_incident():
    faults = [
        {"type": "exception", "step": 17, "t": 100.0, "tier": 1, "mttr_s": 11.0},
        {"type": "node-loss", "step": 37, "t": 200.0, "tier": 2, "mttr_s": 31.0},
        {"type": "node-loss", "step": 37, "t": 200.2, "tier": 2, "mttr_s": 30.8},
        {"type": "node-loss", "step": 37, "t": 400.0, "tier": 2, "mttr_s": 20.0},  # a second, later loss
        {"type": "exception", "step": 50, "t": 500.0, "tier": 1, "mttr_s": 1.0},  # two specs, one step:
        {"type": "exception", "step": 50, "t": 500.1, "tier": 1, "mttr_s": 1.0},  # two faults
    ]
    merged = planner.incidents(faults)
    assert [(f["type"], f["t"]) for f in merged] == [
        ("exception", 100.0),
        ("node-loss", 200.0),
        ("node-loss", 400.0),
        ("exception", 500.0),
        ("exception", 500.1),
    ]
    plan = planner.plan_from_summary(_summary(faults), ckpt_interval_steps=10)
    assert {t.name: round(t.share, 3) for t in plan.tiers} == {"tier1": 0.6, "tier2": 0.4}
