"""The straggler scorer and the eviction policy (trainer/resilience/straggler.py): pure, fast."""

from __future__ import annotations

import pytest

from trainer.resilience.straggler import (
    THRESHOLD,
    WARMUP,
    WINDOW,
    Finding,
    StragglerScorer,
    decide,
)

STEPS = WARMUP + WINDOW + 4


def _run(scorer: StragglerScorer, compute_at: object, steps: int = STEPS) -> list[Finding]:
    found = []
    for step in range(steps):
        compute = compute_at(step)  # type: ignore[operator]
        finding = scorer.add(step, compute, [0.0] * len(compute))
        if finding is not None:
            found.append(finding)
    return found


def test_a_node_three_times_slower_than_its_peers_is_found_once_a_window_holds_it() -> None:
    scorer = StragglerScorer(world_size=8, ranks_per_node=2)

    def compute(step: int) -> list[float]:
        times = [0.1] * 8
        if step >= 1:
            times[5] = 0.3  # rank 5: node 2
        return times

    found = _run(scorer, compute)
    assert [f.node for f in found] == [2]
    (finding,) = found
    assert finding.ranks == (4, 5)
    assert finding.score == pytest.approx(3.0)
    # Reported as soon as the window is full past the warm-up, never before.
    assert finding.step == WARMUP + WINDOW - 1


def test_with_two_nodes_the_slow_one_scores_its_whole_factor() -> None:
    # Against the median of all nodes, (1 + 3) / 2 = 2 would halve the signal; the other nodes' median
    # gives the slow node 3 and the fast one 1/3.
    scorer = StragglerScorer(world_size=2, ranks_per_node=1)
    found = _run(scorer, lambda step: [0.1, 0.3])
    assert [(f.node, f.score) for f in found] == [(1, pytest.approx(3.0))]


def test_a_uniform_slowdown_is_not_a_straggler() -> None:
    # The whole job three times slower from step 5: every node's own history jumps, no peer score does.
    for nodes in (2, 4):
        scorer = StragglerScorer(world_size=nodes, ranks_per_node=1)
        assert _run(scorer, lambda step, n=nodes: [0.1 if step < 5 else 0.3] * n, steps=40) == []


def test_a_node_slow_from_the_start_is_found_and_its_history_says_it_always_was() -> None:
    scorer = StragglerScorer(world_size=3, ranks_per_node=1)
    (finding,) = _run(scorer, lambda step: [0.1, 0.1, 0.25])
    assert finding.node == 2 and finding.history == pytest.approx(1.0)


def test_the_history_says_how_much_slower_the_node_got() -> None:
    scorer = StragglerScorer(world_size=3, ranks_per_node=1)
    start = WARMUP + WINDOW  # the baseline is the first full window
    found = _run(scorer, lambda step: [0.1, 0.1, 0.1 if step < start else 0.4], steps=start + 2 * WINDOW)
    # Found once the window's median turned (half the window slow), reported again a window later, when
    # the whole window is.
    assert [f.node for f in found] == [2, 2]
    assert THRESHOLD < found[0].history < 4.0
    assert found[1].history == pytest.approx(4.0)


def test_single_slow_steps_are_noise_not_a_straggler() -> None:
    # Every third step of node 1 slow (a save, a GC pause): the window's median stays at 1.
    scorer = StragglerScorer(world_size=2, ranks_per_node=1)
    assert _run(scorer, lambda step: [0.1, 0.5 if step % 3 == 0 else 0.1], steps=60) == []


def test_a_node_just_under_the_threshold_is_not_reported() -> None:
    scorer = StragglerScorer(world_size=2, ranks_per_node=1)
    assert _run(scorer, lambda step: [0.1, 0.1 * THRESHOLD * 0.95], steps=40) == []


def test_a_persistent_straggler_is_reported_again_only_after_another_window() -> None:
    scorer = StragglerScorer(world_size=2, ranks_per_node=1)
    found = _run(scorer, lambda step: [0.1, 0.3], steps=WARMUP + 3 * WINDOW)
    steps = [f.step for f in found]
    assert steps == [steps[0], steps[0] + WINDOW, steps[0] + 2 * WINDOW]


def test_one_node_is_reported_per_step_the_slowest() -> None:
    scorer = StragglerScorer(world_size=4, ranks_per_node=1)
    found = _run(scorer, lambda step: [0.1, 0.3, 0.1, 0.5], steps=WARMUP + WINDOW)
    assert [f.node for f in found] == [3]


def test_one_node_has_no_peers_and_no_score() -> None:
    scorer = StragglerScorer(world_size=4, ranks_per_node=4)
    assert _run(scorer, lambda step: [0.1, 0.1, 0.1, 0.9], steps=40) == []


def test_the_finding_names_what_the_straggler_costs_its_peers() -> None:
    scorer = StragglerScorer(world_size=2, ranks_per_node=1)
    finding = None
    for step in range(WARMUP + WINDOW):
        finding = scorer.add(step, [0.1, 0.3], [0.2, 0.0]) or finding
    assert finding is not None and finding.peer_wait_s == pytest.approx(0.2)


# ---------------------------------------------------------------- the policy


def test_evicts_with_the_evict_policy_and_a_spare_standing_by() -> None:
    assert decide("evict", spare_standing_by=True, step=30, last_eviction=None)[0] == "evict"


def test_never_evicts_without_a_spare() -> None:
    action, why = decide("evict", spare_standing_by=False, step=30, last_eviction=None)
    assert action == "report" and "no hot spare" in why


def test_never_evicts_twice_within_a_window() -> None:
    assert decide("evict", spare_standing_by=True, step=30, last_eviction=30 - WINDOW + 1)[0] == "report"
    assert decide("evict", spare_standing_by=True, step=30, last_eviction=30 - WINDOW)[0] == "evict"


def test_the_report_policy_never_evicts() -> None:
    assert decide("report", spare_standing_by=True, step=30, last_eviction=None) == (
        "report",
        "policy is report",
    )


def test_the_peers_median_without_each_node_is_the_median_of_the_others() -> None:
    import random
    import statistics

    import torch

    from trainer.resilience.straggler import medians_without_each

    rng = random.Random(7)
    for n in range(2, 12):
        values = [rng.random() for _ in range(n)]
        got = medians_without_each(torch.tensor(values, dtype=torch.float64)).tolist()
        want = [statistics.median(values[:i] + values[i + 1 :]) for i in range(n)]
        assert got == pytest.approx(want)
