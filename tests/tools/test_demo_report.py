"""The demo's report: report.json fields and the timeline PNG, from a hand-written run."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tools.demo import report, restored_sources


def _write_run(run_dir: Path) -> None:
    """A 2-rank run: steps 0-5, a checkpoint after step 3, an exception on rank 1 early in step 6,
    recovered in-process from that checkpoint (steps 4 and 5 redone), then steps to 9."""
    run_dir.mkdir(parents=True)
    t = 1000.0
    events: dict[int, list[dict[str, Any]]] = {0: [], 1: []}

    def emit(rank: int, ev: str, at: float, iteration: int = 0, **fields: Any) -> None:
        common = {"ev": ev, "t": at, "rank": rank, "pid": 100 + rank, "restart": 0, "iteration": iteration}
        events[rank].append({**common, **fields})

    for rank in (0, 1):
        emit(rank, "run_start", t, world_size=2, config={"ckpt": {"interval_steps": 4}})
        emit(rank, "restore", t + 0.5, step=-1, path="", load_s=0.0)
    clock = t + 1.0
    for step in range(6):
        emit(0, "step", clock + 1.0, step=step, t_start=clock, t_end=clock + 1.0, loss=5.0, tokens=64)
        clock += 1.0
        if step == 3:
            for rank in (0, 1):
                emit(rank, "ckpt_save", clock + 0.1, step=3, blocked_s=0.1, mode="sync", bytes=1000)
            emit(0, "ckpt_commit", clock + 0.2, step=3, path="ckpt/step_3", total_s=0.2)
            clock += 0.2
    emit(1, "fault_injected", clock + 0.1, fault="exception", step=6)
    for rank in (0, 1):
        emit(rank, "fault_detected", clock + 0.3, iteration=1, tier=1, reason="RuntimeError")
        emit(rank, "restore", clock + 0.6, iteration=1, step=3, path="ckpt/step_3", load_s=0.1)
    clock += 0.7
    for step in range(4, 10):
        emit(
            0,
            "step",
            clock + 1.0,
            iteration=1,
            step=step,
            t_start=clock,
            t_end=clock + 1.0,
            loss=4.0,
            tokens=64,
        )
        clock += 1.0
    for rank in (0, 1):
        emit(rank, "run_end", clock + 0.1, iteration=1, step=9, status="completed")
    for rank, evs in events.items():
        (run_dir / f"events.rank{rank}.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evs))


def test_report_writes_json_with_the_faults_and_a_timeline(tmp_path: Path) -> None:
    run_dir = tmp_path / "fsx" / "runs"
    _write_run(run_dir)
    result = report(run_dir, tmp_path, job_ok=True)

    written = json.loads((tmp_path / "report.json").read_text())
    assert written == result
    assert written["steps"] == 10
    assert written["steps_recomputed"] == 2
    assert 0.0 < written["training_efficiency"] < 1.0
    [fault] = written["faults"]
    assert fault["ranks"] == [1]
    assert fault["type"] == "exception" and fault["tier"] == 1 and fault["recovered"] is True
    assert abs(fault["mttr_s"] - 0.6) < 1e-6  # injected 0.1 s into step 6, training again 0.7 s after step 5
    assert abs(fault["detection_s"] - 0.2) < 1e-6
    assert fault["steps_recomputed"] == 2
    png = tmp_path / "timeline.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000


def test_the_report_names_every_source_a_fault_restored_from() -> None:
    one = {"restored_from": "memory", "restored_by_source": {"memory": [0, 1, 2, 3]}}
    assert restored_sources(one) == "memory"
    node_loss = {"restored_from": "shm", "restored_by_source": {"shm": [0, 1], "peer": [2, 3]}}
    assert restored_sources(node_loss) == "peer (ranks 2,3), shm (ranks 0,1)"
    assert restored_sources({"restored_from": "fsx"}) == "fsx"  # a summary from before the field existed
