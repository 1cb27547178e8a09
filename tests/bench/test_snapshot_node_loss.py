"""bench.snapshot's node-loss scenario: a whole node lost, its ranks restored from the replica on the
surviving node (`peer`), and the goodput planner's node-loss tier taking its rollback from that
measurement instead of the assumed value. Cheap: the chart render, the record conversion on a node loss
as trainer.events.metrics reports it, and the planner on bench.snapshot's file (the run itself: make
bench)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench import recovery_pods, snapshot
from goodput.cli import main as goodput_main
from tools.podcommand import LocalPlaces, pod_argv

RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results" / "snapshot.json"


def test_the_node_loss_scenario_loses_a_node_with_snapshots_replicated_to_its_peer() -> None:
    assert "node-loss/peer" in snapshot.POD_FAULT_SCENARIOS
    sc = recovery_pods.SCENARIOS["node-loss/peer"]
    assert sc.snapshots and sc.nodes >= 2 and [f.split(":")[0] for f in sc.faults] == ["node-loss"]
    argv = pod_argv(
        recovery_pods.pod_values(sc, recovery_pods.PodsConfig()),
        LocalPlaces(4321, Path("/d/t.npy"), Path("/r/out")),
    )
    assert "--snapshot-interval=1" in argv and "--snapshot-replication" in argv
    # the scenarios that measure the checkpoint path keep snapshots off
    plain = recovery_pods.pod_values(recovery_pods.SCENARIOS["node-loss/spare"], recovery_pods.PodsConfig())
    assert plain["snapshotInterval"] == 0 and plain["snapshotReplication"] is False


def _pods_run(by_source: dict[str, list[int]], ok: bool = True) -> dict[str, Any]:
    """bench.recovery_pods.run's result for one node loss of node 1 (rank 1): rank 0, the survivor,
    restored from its /dev/shm; `restored_from` is rank 0's source, as trainer.events.metrics reports it."""
    fault = {"type": "node-loss", "step": 6, "rank": 1, "ranks": [1], "tier": 2, "steps_recomputed": 0,
             "restored_step": 5, "restored_from": "shm", "restored_by_source": by_source}  # fmt: skip
    fault["lost_restored_from"] = recovery_pods.lost_source(fault)
    return {"runs": [{"scenario": "node-loss/peer", "rep": 0, "ok": ok, "faults": [fault], "mttr_s": 9.5}]}


def test_a_node_loss_is_recorded_by_where_the_lost_node_restored_from(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = iter([_pods_run({"shm": [0], "peer": [1]}), _pods_run({"shm": [0], "fsx": [1]})])
    monkeypatch.setattr(recovery_pods, "run", lambda names, reps, work, cfg: next(runs))
    (peer,) = snapshot.measure_node_loss(1, tmp_path)
    assert (peer["scenario"], peer["ok"], peer["restored_from"]) == ("node-loss/peer", True, "peer")
    assert peer["restored_by_source"] == {"shm": [0], "peer": [1]} and peer["steps_recomputed"] == 0
    (fsx,) = snapshot.measure_node_loss(1, tmp_path)  # replica gone: the lost node read the checkpoint
    assert fsx["restored_from"] == "fsx"
    # ranks of the lost node that disagree are no measurement of either source
    split = {"ranks": [2, 3], "restored_by_source": {"peer": [2], "fsx": [3]}}
    assert recovery_pods.lost_source(split) is None


def _node_loss_rollback(path: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    assert goodput_main(["--json", "--rollback-from", str(path)]) == 0
    return json.loads(capsys.readouterr().out)["snapshots"]["rollback_steps"]["node-loss"]


def test_the_planner_takes_the_node_loss_rollback_from_the_peer_measurement(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "snapshot.json"
    faults = [
        {"scenario": "node-loss/peer", "ok": True, "restored_from": "peer", "steps_recomputed": s}
        for s in (1, 0, 1)
    ]
    path.write_text(json.dumps({"rows": [], "faults": faults}))
    got = _node_loss_rollback(path, capsys)
    assert got["from"] == "measured (peer restores)" and got["steps"] == 1.0
    path.write_text(json.dumps({"rows": [], "faults": faults[:0]}))
    assert _node_loss_rollback(path, capsys)["from"].startswith("assumed")


def test_the_shipped_bench_results_measure_the_node_loss_rollback(capsys: pytest.CaptureFixture[str]) -> None:
    faults = json.loads(RESULTS.read_text())["faults"]
    peer = [f for f in faults if f["scenario"] == "node-loss/peer"]
    assert peer and all(f["ok"] and f["restored_from"] == "peer" for f in peer), peer
    got = _node_loss_rollback(RESULTS, capsys)
    assert got["from"] == "measured (peer restores)" and got["measured"]["n"] == len(peer)
