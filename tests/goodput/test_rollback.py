"""Measured rollbacks in the planner: memory and peer tiers, losing node and replica together, snapshot
overhead, the best snapshot interval, and the CLI's measurement files."""

from __future__ import annotations

import json
import math

import pytest

from goodput import PlanError, Tier, evaluate, optimal_interval
from goodput.cli import main
from goodput.inputs import measured_rollbacks
from goodput.tiers import parse_tier_spec
from tests.goodput._plans import PEER_TIERS, make_plan


def test_replica_loss_probability_is_the_closed_form():
    plan = make_plan(tiers=PEER_TIERS, peer_correlated=0.05, rereplication_s=600.0, replicas=2)
    lam_node = plan.fault_rate_s * 0.7 / plan.nodes
    assert plan.node_loss_rate_s == pytest.approx(lam_node)
    assert plan.peer_loss_probability == pytest.approx(1 - 0.95 * math.exp(-2 * lam_node * 600.0))
    # A node's own loss rate does not depend on how many nodes the job has.
    assert make_plan(tiers=PEER_TIERS, nodes=64).node_loss_rate_s == pytest.approx(lam_node)
    assert make_plan(tiers=PEER_TIERS).peer_loss_probability == 0.0  # no window, nothing correlated
    assert plan.rollback_rate_s == pytest.approx(plan.fault_rate_s * (0.1 + 0.7 * plan.peer_loss_probability))


def test_a_peer_tier_is_a_memory_tier_until_the_replica_is_lost_and_then_a_checkpoint_tier():
    peer = make_plan(tiers=PEER_TIERS)
    as_memory = peer.with_(
        tiers=(PEER_TIERS[0], Tier("node-loss", 0.7, 180.0, "memory", 12.0), PEER_TIERS[2])
    )
    assert evaluate(peer).efficiency == pytest.approx(evaluate(as_memory).efficiency)
    lost = peer.with_(peer_correlated=1.0)
    as_checkpoint = peer.with_(
        tiers=(PEER_TIERS[0], Tier("node-loss", 0.7, 400.0, "checkpoint"), PEER_TIERS[2])
    )
    assert evaluate(lost).efficiency == pytest.approx(evaluate(as_checkpoint).efficiency)
    assert evaluate(lost).efficiency < evaluate(peer).efficiency


def test_memory_rollback_and_snapshot_overhead_are_charged_and_the_breakdown_adds_up():
    plan = make_plan(tiers=PEER_TIERS, snapshot_overhead=0.002, peer_correlated=0.1)
    out = evaluate(plan)
    assert out.efficiency + sum(out.lost().values()) == pytest.approx(1.0)
    assert out.snapshot == pytest.approx(0.002 * plan.interval_s / out.wall_per_segment_s)
    # Memory-faults per segment x 12 s of recompute each.
    lam_m = plan.fault_rate_s * (0.2 + 0.7 * (1 - plan.peer_loss_probability))
    run = math.expm1(plan.rollback_rate_s * (plan.interval_s * 1.002 + plan.stall_s)) / plan.rollback_rate_s
    assert out.recompute_memory == pytest.approx(lam_m * run * 12.0 / out.wall_per_segment_s)
    free = evaluate(
        plan.with_(
            tiers=tuple(
                Tier(t.name, t.share, t.mttr_s, t.rollback, 0.0, t.fallback_mttr_s) for t in PEER_TIERS
            )
        )
    )
    assert free.efficiency > out.efficiency


def test_the_optimal_interval_with_snapshot_overhead_is_the_maximum():
    plan = make_plan(tiers=PEER_TIERS, snapshot_overhead=0.05, peer_correlated=0.3)
    opt = optimal_interval(plan)
    assert opt == pytest.approx(optimal_interval(plan.with_(snapshot_overhead=0.0)) / 1.05)
    best = evaluate(plan, opt).efficiency
    assert all(evaluate(plan, opt * f).efficiency < best for f in (0.9, 0.99, 1.01, 1.1))


@pytest.mark.parametrize(
    ("tier", "field"),
    [
        (("a", 1.0, 1.0, "checkpoint", 5.0), "rollback_s applies"),
        (("a", 1.0, 1.0, "memory", 0.0, 9.0), "fallback_mttr_s applies"),
        (("a", 1.0, 1.0, "memory", -1.0), "rollback_s"),
        (("a", 1.0, 1.0, "peer", 0.0, math.inf), "fallback_mttr_s"),
    ],
)
def test_invalid_tiers_name_the_field(tier, field):
    with pytest.raises(PlanError, match=field):
        Tier(*tier)


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        ({"peer_correlated": 1.5}, "peer_correlated"),
        ({"rereplication_s": -1.0}, "rereplication_s"),
        ({"replicas": 0}, "replicas"),
        ({"snapshot_overhead": float("nan")}, "snapshot_overhead"),
    ],
)
def test_invalid_rollback_inputs_name_the_field(kw, field):
    with pytest.raises(PlanError, match=field):
        make_plan(**kw)


def test_tier_specs():
    s = parse_tier_spec("node-loss:share=353/419:mttr=180:rollback=peer:fallback-mttr=240")
    assert s.share == pytest.approx(353 / 419) and s.source == "peer" and s.fallback_mttr_s == 240.0
    assert parse_tier_spec("in-job:share=0.1:mttr=120:rollback=memory:source=shm:steps=2").steps == 2.0
    with pytest.raises(PlanError, match="steps= and source= apply"):
        parse_tier_spec("x:share=1:mttr=1:steps=1")
    with pytest.raises(PlanError, match="share must be a number"):
        parse_tier_spec("x:share=1/0:mttr=1")
    with pytest.raises(PlanError, match="fallback_mttr_s applies"):
        parse_tier_spec("x:share=1:mttr=1:rollback=memory:fallback-mttr=3")


def _snapshot_result():
    # The shape bench.snapshot writes: rows with the blocked/floor ratio, and the faulted runs.
    return {
        "rows": [{"mib": 64, "blocked_over_floor": 1.1}, {"mib": 256, "blocked_over_floor": 1.3}],
        "faults": [
            {"scenario": "exception/tier1", "ok": True, "restored_from": "memory", "steps_recomputed": 0},
            {"scenario": "exception/tier1", "ok": True, "restored_from": "memory", "steps_recomputed": 1},
            {"scenario": "exception/tier1", "ok": True, "restored_from": "memory", "steps_recomputed": 0},
            {"scenario": "sigkill/tier2", "ok": True, "restored_from": "shm", "steps_recomputed": 1},
            {"scenario": "sigkill/tier2", "ok": False, "restored_from": "shm", "steps_recomputed": 9},
        ],
    }


def test_measured_rollbacks_by_source(tmp_path):
    path = tmp_path / "snapshot.json"
    path.write_text(json.dumps(_snapshot_result()))
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps({"faults": [{"restored_from": "peer", "steps_recomputed": 1, "tier": 2}]}))
    got = measured_rollbacks([path, summary])
    assert got["memory"] == {"median": 0.0, "min": 0.0, "max": 1.0, "n": 3}
    assert got["shm"]["n"] == 1  # the failed run is left out
    assert got["peer"]["median"] == 1.0


def test_cli_takes_rollbacks_and_blocked_ratio_from_measurements_and_picks_the_best_snapshot_interval(
    tmp_path, capsys
):
    path = tmp_path / "snapshot.json"
    path.write_text(json.dumps(_snapshot_result()))
    common = [
        "--json",
        "--tier",
        "in-process:share=0.3:mttr=30:rollback=memory",
        "--tier",
        "in-job:share=0.2:mttr=120:rollback=memory:source=shm",
        "--tier",
        "node-loss:share=0.5:mttr=180:rollback=peer:steps=2",
    ]
    assert main([*common, "--rollback-from", str(path)]) == 0
    out = json.loads(capsys.readouterr().out)
    snap = out["snapshots"]
    assert snap["blocked_over_floor"] == 1.3  # the largest size's ratio
    assert snap["rollback_steps"]["in-process"]["steps"] == 0.0  # median of 0, 1, 0
    assert snap["rollback_steps"]["in-job"]["steps"] == 1.0
    assert snap["rollback_steps"]["node-loss"] == {"steps": 2.0, "from": "given"}
    k, step = snap["every_steps"], snap["step_s"]
    tiers = {t["name"]: t for t in out["plan"]["tiers"]}
    assert tiers["in-job"]["rollback_s"] == pytest.approx((1.0 + k / 2) * step)
    assert out["plan"]["snapshot_overhead"] == pytest.approx(snap["blocked_s"] / (k * step))
    # Every other snapshot interval does worse.
    for other in (max(1, k - 1), k + 1):
        if other != k:
            assert main([*common, "--rollback-from", str(path), "--snapshot-every", str(other)]) == 0
            assert json.loads(capsys.readouterr().out)["efficiency"] < out["efficiency"]
    assert main(["--rollback-from", str(tmp_path / "missing.json")]) == 2
    assert "missing.json" in capsys.readouterr().err
    assert main(["--snapshot-every", "0"]) == 2
    assert "--snapshot-every" in capsys.readouterr().err


def test_losing_node_and_replica_together_costs_efficiency_in_the_cli(capsys):
    effs = []
    for q in ("0", "0.1", "1"):
        assert main(["--json", "--peer-correlated", q]) == 0
        out = json.loads(capsys.readouterr().out)
        effs.append(out["efficiency"])
        assert out["snapshots"]["peer_loss_probability"] >= float(q)
    assert effs[0] > effs[1] > effs[2]
