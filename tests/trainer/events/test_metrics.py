"""Event log (Contract 3) and summary figures from hand-written event files (exporter: elsewhere)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.trainer.events.events import event as _ev
from trainer.events.metrics import (
    COMMON_FIELDS,
    EventLog,
    read_events,
    summarize,
    summarize_events,
    write_summary,
)


def _write(path: Path, events: list[dict[str, Any]], torn_tail: bool = False) -> None:
    lines = [json.dumps(e) for e in events]
    text = "\n".join(lines) + "\n"
    if torn_tail:
        text += '{"ev": "step", "t": 1'  # a process killed in the middle of a write
    path.write_text(text)


def _step(step: int, t0: float, t1: float, restart: int = 0, iteration: int = 0) -> dict[str, Any]:
    return _ev("step", t1, 0, restart, iteration, step=step, t_start=t0, t_end=t1, loss=2.0, tokens=100)


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """A run with a tier-1 exception at step 4 and a tier-2 SIGKILL at step 5, both resuming from step 2."""
    rank0 = [
        _ev("run_start", 100.0, world_size=2, config={}),
        _ev("restore", 100.5, step=-1, path=None, load_s=0.0),
        _step(1, 101.0, 102.0),
        _step(2, 102.0, 103.0),
        _ev("ckpt_save", 103.1, step=2, blocked_s=0.1, mode="sync", bytes=10),
        _step(3, 103.1, 104.0),
        _ev("ckpt_commit", 103.6, step=2, path="ckpt/step_2", total_s=0.5),
        _ev("fault_detected", 104.5, iteration=1, tier=1, reason="exception on rank 1"),
        _ev("restore", 105.0, iteration=1, step=2, path="ckpt/step_2", load_s=0.2),
        _step(3, 105.2, 106.0, iteration=1),
        _step(4, 106.0, 107.0, iteration=1),
        _ev("fault_detected", 107.3, iteration=1, tier=1, reason="Connection closed by peer"),
        _ev("fault_detected", 108.0, iteration=1, tier=2, reason="SIGTERM"),
        _ev("run_start", 110.0, restart=1, world_size=2, config={}),
        _ev("ckpt_skipped", 110.5, restart=1, path="ckpt/step_4", reason="checksum mismatch"),
        _ev("restore", 111.0, restart=1, step=2, path="ckpt/step_2", load_s=0.3),
        _step(3, 111.5, 112.5, restart=1),
        _step(4, 112.5, 113.5, restart=1),
        _step(5, 113.5, 114.5, restart=1),
        _ev("run_end", 115.0, restart=1, step=5, status="completed"),
    ]
    rank1 = [
        _ev("run_start", 100.0, 1, world_size=2, config={}),
        _ev("ckpt_save", 103.1, 1, step=2, blocked_s=0.3, mode="sync", bytes=12),
        _ev("fault_injected", 104.2, 1, fault="exception", step=4),
        _ev("fault_detected", 104.6, 1, iteration=1, tier=1, reason="exception"),
        _ev("fault_injected", 107.1, 1, iteration=1, fault="sigkill", step=5),
    ]
    _write(tmp_path / "events.rank0.jsonl", rank0)
    _write(tmp_path / "events.rank1.jsonl", rank1, torn_tail=True)
    return tmp_path


def test_summary_of_a_faulted_run(run_dir: Path) -> None:
    s = summarize(run_dir)
    assert s["status"] == "completed" and s["final_step"] == 5
    assert (s["steps"], s["steps_executed"], s["steps_recomputed"]) == (5, 8, 3)
    assert s["wall_s"] == pytest.approx(15.0)
    assert s["productive_s"] == pytest.approx(5.0)  # the last execution of steps 1..5, 1 s each
    assert s["training_efficiency"] == pytest.approx(5.0 / 15.0)
    assert s["tokens"] == 500
    assert s["unreadable_lines"] == 1
    assert s["ckpt"]["saves"] == 1 and s["ckpt"]["stall_s"]["max"] == pytest.approx(0.3)
    assert s["ckpt"]["per_save"][0]["bytes"] == 22 and s["ckpt"]["commits"] == 1
    assert s["ckpt"]["skipped"] == [{"path": "ckpt/step_4", "reason": "checksum mismatch"}]
    assert [r["step"] for r in s["restores"]] == [-1, 2, 2]
    assert s["process_starts"] == 3

    exc, kill = s["faults"]
    assert (exc["type"], exc["tier"], exc["recovered"]) == ("exception", 1, True)
    assert exc["detection_s"] == pytest.approx(0.3)
    assert exc["mttr_s"] == pytest.approx(1.0)  # 104.2 -> step 3 restarted at 105.2
    assert exc["steps_recomputed"] == 1  # step 3 was done, resumed from 2
    assert exc["time_to_new_progress_s"] == pytest.approx(106.0 - 104.2)
    assert (kill["type"], kill["tier"], kill["restored_step"]) == ("sigkill", 2, 2)
    # Seen first by the survivor's Wrapper (tier 1), recovered by the launcher (tier 2).
    assert kill["detection_s"] == pytest.approx(0.2)
    assert kill["mttr_s"] == pytest.approx(111.5 - 107.1)
    assert kill["steps_recomputed"] == 2  # steps 3 and 4 redone
    assert sum(f["steps_recomputed"] for f in s["faults"]) == s["steps_recomputed"]


def test_the_loss_breakdown_names_the_gap_to_100_percent_term_by_term(run_dir: Path) -> None:
    s = summarize(run_dir)
    loss = s["loss_s"]
    assert loss["startup"] == pytest.approx(1.0)  # run_start 100.0 -> first step 101.0
    assert loss["recovery"] == pytest.approx([1.0, 111.5 - 107.1])  # each fault's mttr_s
    assert loss["recompute"] == pytest.approx(0.9 + 0.8 + 1.0)  # step 3, step 3 again, step 4: redone
    assert loss["ckpt_stall"] == pytest.approx(0.1)  # rank 0's (rank 1's 0.3 s is inside rank 0's step 3)
    assert loss["snapshot_stall"] == 0.0 and loss["tail"] == pytest.approx(0.5)
    named = s["productive_s"] + sum(loss["recovery"]) + sum(v for k, v in loss.items() if k != "recovery")
    assert named == pytest.approx(s["wall_s"]) and loss["other"] == pytest.approx(0.3)


def test_snapshot_stall_in_the_breakdown_is_rank_0s_inside_the_run(tmp_path: Path) -> None:
    """Rank 0's snapshot of step 0 blocks 0.1 s, node 1's (rank 2) 0.3 s: rank 0 starts step 1 after its
    own 0.1 s and waits the other 0.2 s in that step's first collective (step 1 runs 1.2 s, not 1.0 s).
    Counting node 1's 0.3 s as the stall would count those 0.2 s twice (`other` negative)."""
    events = [
        _ev("run_start", 0.0, world_size=4, config={}),
        _step(0, 1.0, 2.0),
        _ev("snapshot", 2.1, step=0, blocked_s=0.1, copy_s=0.1, bytes=1),
        _ev("snapshot", 2.3, 2, step=0, blocked_s=0.3, copy_s=0.3, bytes=1),
        _step(1, 2.1, 3.3),
        _ev("snapshot", 3.4, step=1, blocked_s=0.1, copy_s=0.1, bytes=1),  # after the last step: tail
        _ev("run_end", 3.5, step=1, status="completed"),
    ]
    _write(tmp_path / "events.rank0.jsonl", events)
    loss = summarize(tmp_path)["loss_s"]
    assert loss["snapshot_stall"] == pytest.approx(0.1) and loss["tail"] == pytest.approx(0.2)
    assert loss["other"] == pytest.approx(0.0, abs=1e-9)  # 3.5 = 1.0 startup + 2.2 steps + 0.1 + 0.2


def test_a_snapshot_rank_0_did_not_report_counts_with_the_slowest_rank_that_did(tmp_path: Path) -> None:
    events = [
        _ev("run_start", 0.0, world_size=4, config={}),
        _step(0, 1.0, 2.0),
        _ev("snapshot", 2.3, 2, step=0, blocked_s=0.3, copy_s=0.3, bytes=1),
        _ev("snapshot", 2.2, 3, step=0, blocked_s=0.2, copy_s=0.2, bytes=1),
        _step(1, 2.3, 3.3),
        _ev("run_end", 3.5, step=1, status="completed"),
    ]
    _write(tmp_path / "events.rank0.jsonl", events)
    assert summarize(tmp_path)["loss_s"]["snapshot_stall"] == pytest.approx(0.3)


def test_slow_steps_names_the_kept_steps_over_twice_the_median_and_their_time_beyond_it(
    tmp_path: Path,
) -> None:
    durations = [3.0, 1.0, 1.0, 2.5, 1.0, 1.0, 2.0]  # median 1.0: steps 0 and 3 are slow, 6 is not (2x)
    t, events = 0.0, []
    for step, d in enumerate(durations):
        events.append(_step(step, t, t + d))
        t += d
    events.append(_step(3, t, t + 5.0, restart=1))  # step 3 redone: only its kept (last) run counts
    _write(tmp_path / "events.rank0.jsonl", events)
    s = summarize(tmp_path)
    slow = s["slow_steps"]
    assert slow["median_s"] == pytest.approx(1.0)
    assert slow["steps"] == [0, 3]
    assert slow["over_median_s"] == pytest.approx((3.0 - 1.0) + (5.0 - 1.0))
    assert summarize_events([])["slow_steps"] == {"median_s": None, "steps": [], "over_median_s": 0.0}


def test_tier_is_inferred_when_no_rank_reported_the_fault(tmp_path: Path) -> None:
    _write(
        tmp_path / "events.rank0.jsonl",
        [
            _step(1, 1.0, 2.0),
            _ev("fault_injected", 2.5, fault="node-loss", step=2),
            _ev("restore", 6.0, restart=1, step=1, path="p", load_s=0.1),
            _step(2, 6.5, 7.0, restart=1),
        ],
    )
    (fault,) = summarize(tmp_path)["faults"]
    assert fault["tier"] == 2 and fault["detection_s"] is None and fault["mttr_s"] == pytest.approx(4.0)
    assert summarize(tmp_path)["status"] == "unknown"


def test_a_lost_node_reported_by_each_of_its_ranks_is_one_fault(tmp_path: Path) -> None:
    _write(
        tmp_path / "events.rank0.jsonl",
        [_step(1, 1.0, 2.0), _step(2, 6.5, 7.0, restart=1), _step(3, 8.0, 9.0, restart=1)],
    )
    _write(tmp_path / "events.rank2.jsonl", [_ev("fault_injected", 2.51, rank=2, fault="node-loss", step=2)])
    _write(
        tmp_path / "events.rank3.jsonl",
        [
            _ev("fault_injected", 2.50, rank=3, fault="node-loss", step=2),
            # The same kind and step again after training went on: a second fault, not a duplicate.
            _ev("fault_injected", 7.5, rank=3, fault="node-loss", step=2),
        ],
    )
    first, second = summarize(tmp_path)["faults"]
    assert first["ranks"] == [3, 2] and first["t"] == pytest.approx(2.50)
    assert first["type"] == "node-loss"
    assert first["mttr_s"] == pytest.approx(4.0)
    assert second["ranks"] == [3] and second["t"] == pytest.approx(7.5)


def test_a_node_loss_says_where_each_rank_restored_from(tmp_path: Path) -> None:
    # Survivors (ranks 0, 1) restore from their pod's /dev/shm, the replaced node's (2, 3) from a peer.
    def restore(t: float, rank: int, source: str) -> dict[str, Any]:
        return _ev("restore", t, rank=rank, restart=1, step=1, path=None, load_s=0.1, source=source)

    _write(
        tmp_path / "events.rank0.jsonl",
        [_step(1, 1.0, 2.0), restore(6.0, 0, "shm"), _step(2, 6.5, 7.0, restart=1)],
    )
    _write(tmp_path / "events.rank1.jsonl", [restore(6.1, 1, "shm")])
    _write(
        tmp_path / "events.rank2.jsonl",
        [_ev("fault_injected", 2.5, rank=2, fault="node-loss", step=2), restore(6.2, 2, "peer")],
    )
    _write(tmp_path / "events.rank3.jsonl", [restore(6.3, 3, "peer"), restore(9.0, 3, "fsx")])
    (fault,) = summarize(tmp_path)["faults"]
    assert fault["restored_from"] == "shm"  # rank 0's
    assert fault["restored_by_source"] == {"shm": [0, 1], "peer": [2, 3]}  # each rank's first after it


def test_two_faults_at_the_same_step_on_two_ranks_stay_two(tmp_path: Path) -> None:
    _write(
        tmp_path / "events.rank0.jsonl",
        [_step(1, 1.0, 2.0), _ev("fault_injected", 2.5, fault="hang", step=2)],
    )
    _write(tmp_path / "events.rank1.jsonl", [_ev("fault_injected", 2.6, rank=1, fault="hang", step=2)])
    assert [f["ranks"] for f in summarize(tmp_path)["faults"]] == [[0], [1]]


def test_unrecovered_fault(tmp_path: Path) -> None:
    _write(
        tmp_path / "events.rank0.jsonl",
        [_step(1, 1.0, 2.0), _ev("fault_injected", 2.5, fault="hang", step=2)],
    )
    (fault,) = summarize(tmp_path)["faults"]
    assert fault["recovered"] is False and fault["mttr_s"] is None and fault["steps_recomputed"] is None


def test_event_log_appends_common_fields_across_processes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    with EventLog(tmp_path, rank=1) as log:
        log.iteration = 3
        log.emit("step", step=7, t_start=1.5, t_end=2.5, loss=0.5, tokens=64)
        with pytest.raises(ValueError, match=r"missing field.*reason"):
            log.emit("fault_detected", tier=1)
    with EventLog(tmp_path, rank=1) as log:  # a restarted process appends
        log.emit("run_end", step=7, status="completed", path=Path("/x"))
    events, bad = read_events(tmp_path)
    assert bad == 0 and [e["ev"] for e in events] == ["step", "run_end"]
    first = events[0]
    assert set(COMMON_FIELDS) <= first.keys()
    assert (first["rank"], first["pid"], first["restart"], first["iteration"], first["t"]) == (
        1,
        os.getpid(),
        2,
        3,
        2.5,
    )
    assert events[1]["path"] == "/x"
    assert json.loads(write_summary(tmp_path).read_text())["status"] == "unknown"  # rank 0 wrote no run_end
