"""bench/synth.py's pieces that need no synth: generated teams validate, process-tree RSS is measured."""

from __future__ import annotations

import os

import pytest

from bench.synth import _stats, _tree_rss_bytes, generate_teams
from infra.config import parse_teams


@pytest.mark.parametrize("n", [1, 5, 50])
def test_generated_teams_are_valid_and_distinct(n: int) -> None:
    teams = parse_teams(generate_teams(n))
    assert len(teams) == len({t.name for t in teams}) == n
    assert len({t.network.vpc_cidr for t in teams}) == n
    if n >= 3:
        assert {t.gpu_node_group.capacity.type for t in teams} == {
            "on-demand",
            "reservation",
            "capacity-block",
        }


def test_generate_teams_rejects_impossible_counts() -> None:
    with pytest.raises(ValueError, match=r"n_teams must be 1\.\.250"):
        generate_teams(0)


def test_tree_rss_counts_this_process() -> None:
    rss = _tree_rss_bytes(os.getpid())
    assert 10 * 2**20 < rss < 64 * 2**30


def test_stats_median_and_spread() -> None:
    assert _stats([3.0, 1.0, 2.0]) == {"median": 2.0, "min": 1.0, "max": 3.0, "runs": [3.0, 1.0, 2.0]}
