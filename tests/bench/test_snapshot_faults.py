"""bench.snapshot --faults: real faulted runs with a snapshot every step restore from memory (tier 1),
from /dev/shm (worker restart) and, for a lost node, from its peer's replica, and recompute at most one
step. Several training runs: a soak test."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import snapshot


@pytest.mark.soak
@pytest.mark.slow
def test_faulted_runs_restore_from_snapshots_and_recompute_at_most_one_step(tmp_path: Path) -> None:
    faults = snapshot.measure_faults(1, tmp_path / "work")
    assert [f["scenario"] for f in faults] == [*snapshot.FAULT_SCENARIOS, *snapshot.POD_FAULT_SCENARIOS]
    assert all(f["ok"] for f in faults), faults
    by_scenario = {f["scenario"]: f for f in faults}
    assert by_scenario["exception/tier1"]["restored_from"] == "memory"
    assert by_scenario["exception/tier2"]["restored_from"] == "shm"
    assert by_scenario["sigkill/tier2"]["restored_from"] == "shm"
    # a lost node's rank came back from the surviving node's replica, the survivor from its /dev/shm
    assert by_scenario["node-loss/peer"]["restored_from"] == "peer"
    assert set(by_scenario["node-loss/peer"]["restored_by_source"]) == {"shm", "peer"}
    assert all(f["steps_recomputed"] <= 1 for f in faults), faults
