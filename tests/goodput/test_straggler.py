"""The planner's straggler term (goodput/straggler.py)."""

from __future__ import annotations

import pytest

from goodput.cli import build_parser, run_plan
from goodput.straggler import StragglerTerm


def test_an_evicted_straggler_costs_its_detection_at_reduced_speed_plus_a_node_loss() -> None:
    term = StragglerTerm(rate_per_node_day=1.0, slowdown=3.0, policy="evict", detect_steps=10)
    # 10 steps of 2 s, each 3x slower: 60 s of wall, two thirds of it lost; then the node loss's 70 s.
    assert term.cost_s(step_s=2.0, evict_mttr_s=70.0) == pytest.approx(40.0 + 70.0)


def test_a_reported_straggler_costs_its_slowdown_until_someone_acts() -> None:
    term = StragglerTerm(rate_per_node_day=1.0, slowdown=2.0, policy="report", mitigation_s=3600.0)
    assert term.cost_s(step_s=2.0, evict_mttr_s=70.0) == pytest.approx(1800.0)


def test_the_lost_fraction_scales_with_the_nodes_and_is_capped() -> None:
    term = StragglerTerm(rate_per_node_day=0.01, slowdown=2.0, policy="report", mitigation_s=3600.0)
    one = term.lost(nodes=100, step_s=2.0, evict_mttr_s=70.0)
    assert one == pytest.approx(100 * 0.01 / 86400 * 1800.0)
    assert term.lost(nodes=200, step_s=2.0, evict_mttr_s=70.0) == pytest.approx(2 * one)
    assert term.lost(nodes=10**9, step_s=2.0, evict_mttr_s=70.0) == 1.0
    assert StragglerTerm(rate_per_node_day=0.0).lost(nodes=2048, step_s=6.0, evict_mttr_s=70.0) == 0.0


@pytest.mark.parametrize(
    ("kwargs", "word"),
    [
        ({"rate_per_node_day": -1.0}, "rate"),
        ({"slowdown": 0.5}, "slowdown"),
        ({"policy": "ignore"}, "policy"),
        ({"mitigation_s": -1.0}, "mitigation"),
    ],
)
def test_bad_inputs_are_refused_naming_them(kwargs: dict[str, object], word: str) -> None:
    with pytest.raises(ValueError, match=word):
        StragglerTerm(**kwargs)  # type: ignore[arg-type]


def test_the_planner_reports_eviction_ahead_of_reporting_only() -> None:
    evict = run_plan(build_parser().parse_args([]))["stragglers"]
    report = run_plan(build_parser().parse_args(["--straggler-policy", "report"]))["stragglers"]
    assert 0 < evict["lost"] < report["lost"] < 1
    assert evict["efficiency"] > report["efficiency"]
