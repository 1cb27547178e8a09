"""A straggler evicted into the hot spare, end to end: the chart's pod command as 2 local pods + 1 hot
spare (bench/recovery_pods.py `straggler/evict`), node 1 made three times slower from step 3 by the
`slow` fault. The straggler watch (trainer/resilience/straggler.py) finds it after a window, its pod
leaves with the eviction status, the spare takes node 1's place from the survivor's replica as after a
node loss, and the run ends bitwise equal to the session's fault-free pods run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench import recovery_pods
from tests.trainer.launcher.pods import PODS_CFG, pods_data
from trainer.events.metrics import read_events
from trainer.resilience.straggler import EVICTED_EXIT, THRESHOLD

pytestmark = pytest.mark.slow


def _final_state(out: Path) -> str:
    events, _ = read_events(out)
    (end,) = [e for e in events if e["ev"] == "run_end" and e.get("state_sha256")]
    return str(end["state_sha256"])


def _logs(run_dir: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in sorted((run_dir / "logs").glob("*.log")))


def test_a_slow_node_is_evicted_into_the_spare_and_the_run_ends_as_a_clean_one(
    tmp_path: Path,
    tmp_path_factory: pytest.TempPathFactory,
    pods_clean_run: tuple[dict[str, Any], Path],
) -> None:
    sc = recovery_pods.SCENARIOS["straggler/evict"]
    rec = recovery_pods.run_once(sc, PODS_CFG, tmp_path / "run", pods_data(tmp_path_factory))
    assert rec["succeeded"] and rec["status"] == "completed", (rec["reason"], _logs(tmp_path / "run")[-6000:])

    events, _ = read_events(tmp_path / "run" / "out")
    found = [e for e in events if e["ev"] == "straggler"]
    # Found once, on node 1, and evicted: the spare stood by. The node that took its place is not slow
    # (the fault stays with the pod that fired it), so nothing is found again.
    assert [(e["node"], e["action"]) for e in found] == [(1, "evict")], found
    assert found[0]["score"] >= THRESHOLD and found[0]["reason"] == "a hot spare stands by"

    # Only the straggler's pod left early, with the eviction status (not counted by the chart's
    # podFailurePolicy); the spare took over.
    early = [e for e in rec["pod_exits"] if e["reason"] != "succeeded"]
    assert [e["returncode"] for e in early] == [EVICTED_EXIT], rec["pod_exits"]
    assert rec["takeover"] is not None and rec["takeover"] != f"pod-{early[0]['index']}"
    assert rec["unplanned_pod_restarts"] == 0 and rec["ok"], rec  # the bench counts it as it should

    # As after a node loss: the survivor restored its own snapshot, node 1's new pod the replica its ring
    # neighbour kept; at most one step recomputed.
    (slow,) = rec["faults"]
    assert slow["type"] == "slow" and slow["steps_recomputed"] <= 1, slow
    assert slow["restored_by_source"] == {"shm": [0], "peer": [1]}, slow

    clean, _ = pods_clean_run
    assert clean["succeeded"], clean["reason"]
    assert _final_state(tmp_path / "run" / "out") == _final_state(pods_clean_run[1] / "out")
