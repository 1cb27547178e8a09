"""Fitting the planner to a measured run (summary.json + events) and to bench.recovery's MTTRs."""

from __future__ import annotations

import json

import pytest

import goodput
from goodput import PlanError, Tier
from goodput.cli import main
from goodput.inputs import GUARD_ROLLBACK_S, NODE_LOSS_MTTR_S
from tests.goodput._plans import TIERS


def _summary(faults, efficiency=0.8):
    # The shape trainer.events.metrics.summarize writes.
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
    plan = goodput.plan_from_summary(_summary(faults), ckpt_interval_steps=10)
    assert plan.interval_s == pytest.approx(10.0)  # 10 steps x 1 s
    assert plan.stall_s == pytest.approx(0.5)
    by_name = {t.name: t for t in plan.tiers}
    # A memory rollback recomputes its steps plus half the step in flight: (0 + 0.5) x 1 s.
    assert by_name["tier1"] == Tier("tier1", 1 / 3, 2.0, "memory", 0.5)
    assert by_name["tier2"] == Tier("tier2", 2 / 3, 10.0, "checkpoint")
    assert plan.fault_rate_s == pytest.approx(3 / (125.0 - 22.0))
    with pytest.raises(PlanError, match="ckpt_interval_steps"):
        goodput.plan_from_summary(_summary(faults))


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
    result = goodput.predict_from_summary(path)
    assert result["fixed_overheads_s"] == {"startup_s": 2.0, "tail_s": 3.0}
    model = result["model_efficiency"]
    assert result["predicted_efficiency"] == pytest.approx(100.0 / (100.0 / model + 5.0))
    assert result["difference_pp"] == pytest.approx(100 * (result["predicted_efficiency"] - 0.8))
    assert result["plan"]["interval_s"] == pytest.approx(10.0)
    # The fault rate is per second of running time: start-up, tail and recovery are not running.
    assert result["plan"]["rate_per_gpu_hour"] == pytest.approx(3600 / (125.0 - 5.0 - 5.0))
    with pytest.raises(PlanError, match="wall_s"):
        goodput.plan_from_summary({"steps": 1})


def test_prediction_on_a_synthetic_run_with_known_costs(tmp_path):
    # 100 s of steps, 10 saves of 0.5 s, one rollback fault with 5 s recovery and 5 s recompute, 5 s fixed:
    # the measured wall is 120 s. The model's expected recompute for one fault is half a segment here, so
    # the prediction must land close to the measured 100/120.
    summary = _summary([{"tier": 2, "mttr_s": 5.0, "steps_recomputed": 5, "restored_step": 44}], 100 / 120)
    summary["wall_s"] = 120.0
    result = goodput.predict_from_summary(_write_run(tmp_path, summary))
    assert abs(result["difference_pp"]) < 2.0


def test_measured_mttrs_come_from_the_recovery_bench(tmp_path, capsys):
    rec = {
        "summary": {
            "exception/tier1": {"mttr_s": {"median": 1.5, "min": 1.0, "max": 2.0, "n": 3}},
            "sigkill/tier2": {"mttr_s": {"median": 6.0, "min": 5.0, "max": 7.0, "n": 3}},
            "exception/full": {"mttr_s": {"median": 12.0, "min": 11.0, "max": 14.0, "n": 3}},
        }
    }
    tiers = goodput.with_measured_mttrs(TIERS, rec)
    assert [t.mttr_s for t in tiers] == [1.5, 6.0, 12.0]
    assert [t.share for t in tiers] == [t.share for t in TIERS]
    del rec["summary"]["sigkill/tier2"]
    with pytest.raises(PlanError, match="in-job"):
        goodput.with_measured_mttrs(TIERS, rec)
    rec["summary"]["sigkill/tier2"] = {"mttr_s": {"median": 6.0}}
    path = tmp_path / "recovery.json"
    path.write_text(json.dumps(rec))
    assert main(["--measured", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    # The default tiers: in-process measured, node-loss (no scenario: its assumed MTTR), job-restart,
    # corruption (no scenario: the guard's rollback, assumed).
    mttrs = [t["mttr_s"] for t in out["plan"]["tiers"]]
    assert mttrs == [1.5, float(NODE_LOSS_MTTR_S), 12.0, GUARD_ROLLBACK_S]


def test_a_node_loss_reported_by_each_rank_is_one_incident():
    faults = [
        {"type": "exception", "step": 17, "t": 100.0, "tier": 1, "mttr_s": 11.0},
        {"type": "node-loss", "step": 37, "t": 200.0, "tier": 2, "mttr_s": 31.0},
        {"type": "node-loss", "step": 37, "t": 200.2, "tier": 2, "mttr_s": 30.8},
        {"type": "node-loss", "step": 37, "t": 400.0, "tier": 2, "mttr_s": 20.0},  # a second, later loss
        {"type": "exception", "step": 50, "t": 500.0, "tier": 1, "mttr_s": 1.0},  # two specs, one step:
        {"type": "exception", "step": 50, "t": 500.1, "tier": 1, "mttr_s": 1.0},  # two faults
    ]
    merged = goodput.incidents(faults)
    assert [(f["type"], f["t"]) for f in merged] == [
        ("exception", 100.0),
        ("node-loss", 200.0),
        ("node-loss", 400.0),
        ("exception", 500.0),
        ("exception", 500.1),
    ]
    plan = goodput.plan_from_summary(_summary(faults), ckpt_interval_steps=10)
    assert {t.name: round(t.share, 3) for t in plan.tiers} == {"tier1": 0.6, "tier2": 0.4}


def test_predict_from_summary_counts_a_stragglers_wait_and_eviction_as_fixed_costs(tmp_path):
    summary = _summary([], 0.7) | {"loss_s": {"straggler": 6.0, "eviction": 1.5, "startup": 2.0}}
    result = goodput.predict_from_summary(_write_run(tmp_path, summary))
    assert result["fixed_overheads_s"] == {
        "startup_s": 2.0,
        "tail_s": 3.0,
        "straggler_s": 6.0,
        "eviction_s": 1.5,
    }
    model = result["model_efficiency"]
    assert result["predicted_efficiency"] == pytest.approx(100.0 / (100.0 / model + 12.5))
