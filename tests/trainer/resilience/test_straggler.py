"""The straggler scorer and the eviction policy (trainer/resilience/straggler.py): pure, fast."""

from __future__ import annotations

import pytest

from trainer.resilience.straggler import (
    FAST_STEPS,
    FAST_THRESHOLD,
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


def test_a_node_three_times_slower_than_its_peers_is_found_after_a_few_steps() -> None:
    scorer = StragglerScorer(world_size=8, ranks_per_node=2)

    def compute(step: int) -> list[float]:
        times = [0.1] * 8
        if step >= 1:
            times[5] = 0.3  # rank 5: node 2
        return times

    found = _run(scorer, compute, steps=WARMUP + WINDOW)
    assert [f.node for f in found] == [2]
    (finding,) = found
    assert finding.ranks == (4, 5)
    assert finding.score == pytest.approx(3.0)
    # Past FAST_THRESHOLD in each of FAST_STEPS scored steps after the warm-up: no full window needed.
    assert finding.step == WARMUP + FAST_STEPS - 1 and finding.steps == FAST_STEPS


def test_a_mild_straggler_waits_for_the_windows_rule() -> None:
    # 1.8x: past THRESHOLD, under FAST_THRESHOLD: found once a full window's median holds it, never before.
    assert THRESHOLD < 1.8 < FAST_THRESHOLD
    scorer = StragglerScorer(world_size=4, ranks_per_node=1)
    (finding,) = _run(scorer, lambda step: [0.1, 0.1, 0.1, 0.18], steps=WARMUP + WINDOW + 1)
    assert finding.step == WARMUP + WINDOW - 1 and finding.steps == WINDOW
    assert finding.score == pytest.approx(1.8)


def test_slow_steps_that_are_not_consecutive_wait_for_the_window() -> None:
    # Two slow steps in every three (3x): never FAST_STEPS in a row, so nothing before the window is full.
    scorer = StragglerScorer(world_size=2, ranks_per_node=1)
    found = _run(scorer, lambda step: [0.1, 0.1 if step % 3 == 0 else 0.3], steps=WARMUP + WINDOW + 4)
    assert found and found[0].step >= WARMUP + WINDOW - 1 and found[0].steps == WINDOW


def test_each_steps_excess_is_its_wait_for_a_node_past_the_threshold() -> None:
    scorer = StragglerScorer(world_size=3, ranks_per_node=1)
    excess = []
    for step, compute in enumerate([[0.1, 0.1, 0.3]] * WARMUP + [[0.1, 0.12, 0.3], [0.1, 0.1, 0.14]]):
        scorer.add(step, compute, [0.0] * 3)
        excess.append(scorer.excess_s)
    # nothing in the warm-up; 0.3 over the others' median 0.11; 1.4x is under the threshold: noise
    assert excess == [0.0] * WARMUP + [pytest.approx(0.19), 0.0]


def test_with_two_nodes_the_slow_one_scores_its_whole_factor() -> None:
    # Against the median of all nodes, (1 + 3) / 2 = 2 would halve the signal; the other nodes' median
    # gives the slow node 3 and the fast one 1/3.
    scorer = StragglerScorer(world_size=2, ranks_per_node=1)
    found = _run(scorer, lambda step: [0.1, 0.3], steps=WARMUP + WINDOW)
    assert [(f.node, f.score) for f in found] == [(1, pytest.approx(3.0))]


def test_a_uniform_slowdown_is_not_a_straggler() -> None:
    # The whole job three times slower from step 5: every node's own history jumps, no peer score does.
    for nodes in (2, 4):
        scorer = StragglerScorer(world_size=nodes, ranks_per_node=1)
        assert _run(scorer, lambda step, n=nodes: [0.1 if step < 5 else 0.3] * n, steps=40) == []


def test_a_node_slow_from_the_start_is_found_and_its_history_says_it_always_was() -> None:
    scorer = StragglerScorer(world_size=3, ranks_per_node=1)
    (finding,) = _run(scorer, lambda step: [0.1, 0.1, 0.25], steps=WARMUP + WINDOW)
    assert finding.node == 2 and finding.history == pytest.approx(1.0)


def test_the_history_says_how_much_slower_the_node_got() -> None:
    scorer = StragglerScorer(world_size=3, ranks_per_node=1)
    start = WARMUP + WINDOW  # the baseline is the first full window
    found = _run(scorer, lambda step: [0.1, 0.1, 0.1 if step < start else 0.4], steps=start + 2 * WINDOW)
    # Found after FAST_STEPS slow steps, reported again a window later.
    assert [(f.node, f.step) for f in found] == [
        (2, start + FAST_STEPS - 1),
        (2, start + FAST_STEPS - 1 + WINDOW),
    ]
    assert [f.history for f in found] == [pytest.approx(4.0), pytest.approx(4.0)]


def test_the_history_of_a_mild_straggler_mixes_its_window() -> None:
    # At 1.8x only the window's median finds it: with half the window slow the median is (1 + 1.8) / 2,
    # under the threshold; with one more slow step, 1.8.
    scorer = StragglerScorer(world_size=3, ranks_per_node=1)
    start = WARMUP + WINDOW
    found = _run(scorer, lambda step: [0.1, 0.1, 0.1 if step < start else 0.18], steps=start + WINDOW)
    assert [(f.node, f.step) for f in found] == [(2, start + WINDOW // 2)]
    assert found[0].history == pytest.approx(1.8)


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


def test_one_node_is_reported_per_step_the_slowest_first() -> None:
    scorer = StragglerScorer(world_size=4, ranks_per_node=1)
    found = _run(scorer, lambda step: [0.1, 0.3, 0.1, 0.5], steps=WARMUP + WINDOW)
    first = WARMUP + FAST_STEPS - 1
    assert [(f.step, f.node) for f in found] == [(first, 3), (first + 1, 1)]


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
