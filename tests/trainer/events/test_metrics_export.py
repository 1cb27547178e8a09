"""The live Prometheus figures (trainer/events/metrics_export.py) agree with summary.json for the same events.

Events are written by the real EventLog (then re-timed, so the figures are exact), scraped over HTTP
from a real MetricsServer and parsed with prometheus_client's own text parser.
"""

from __future__ import annotations

import json
import threading
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from trainer.events.metrics import summarize, write_summary
from trainer.events.metrics_export import EventTail, RunCollector
from trainer.events.metrics_server import MetricsServer


def _lines(rank: int, events: list[tuple[str, float, dict[str, Any]]]) -> str:
    common = {"rank": rank, "pid": 1, "restart": 0, "iteration": 0}
    return "".join(json.dumps({"ev": ev, "t": t, **common, **f}) + "\n" for ev, t, f in events)


def _step(step: int, t0: float, t1: float) -> tuple[str, float, dict[str, Any]]:
    return ("step", t1, {"step": step, "t_start": t0, "t_end": t1, "loss": 3.0 - step / 10, "tokens": 64})


RANK0 = [
    ("run_start", 100.0, {"world_size": 2, "config": {}}),
    ("restore", 100.5, {"step": -1, "path": "", "load_s": 0.0}),
    _step(0, 101.0, 102.0),
    _step(1, 102.0, 103.0),
    ("ckpt_save", 103.1, {"step": 1, "blocked_s": 0.2, "mode": "sync", "bytes": 10}),
    ("ckpt_failed", 103.3, {"step": 1, "reason": "disk full"}),
    ("ckpt_commit", 103.4, {"step": 1, "path": "ckpt/step_1", "total_s": 0.3}),
    _step(2, 103.2, 104.0),
    ("fault_detected", 104.6, {"tier": 1, "reason": "peer failed"}),
    ("restore", 105.0, {"step": 1, "path": "ckpt/step_1", "load_s": 0.2}),
    _step(2, 105.5, 106.5),
    _step(3, 106.5, 107.5),
]
RANK1 = [
    ("run_start", 100.0, {"world_size": 2, "config": {}}),
    ("ckpt_save", 103.1, {"step": 1, "blocked_s": 0.4, "mode": "sync", "bytes": 12}),
    ("ckpt_failed", 103.3, {"step": 1, "reason": "disk full"}),  # not rank 0's: the summary counts rank 0
    ("fault_injected", 104.2, {"fault": "exception", "step": 3}),
    ("fault_detected", 104.5, {"tier": 1, "reason": "InjectedFault"}),
]
END = [("run_end", 108.0, {"step": 3, "status": "completed"})]


def _write_run(out: Path, *, completed: bool) -> None:
    out.mkdir(exist_ok=True)
    (out / "events.rank0.jsonl").write_text(_lines(0, RANK0 + (END if completed else [])))
    (out / "events.rank1.jsonl").write_text(_lines(1, RANK1))


def _scrape(port: int) -> dict[str, float]:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(body):
        for s in family.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            samples[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return samples


def test_a_completed_run_exports_what_summary_json_holds(tmp_path: Path) -> None:
    _write_run(tmp_path, completed=True)
    summary = json.loads(write_summary(tmp_path).read_text())
    server = MetricsServer(tmp_path, 0, rank=0, addr="127.0.0.1")
    try:
        m = _scrape(server.port)
    finally:
        server.close()
    assert m["trainer_goodput_ratio"] == pytest.approx(summary["training_efficiency"], abs=1e-12)
    assert m["trainer_goodput_ratio"] == pytest.approx(4.0 / 8.0)  # steps 0, 1, 2 (2nd run), 3 over 8 s
    assert m["trainer_productive_seconds"] == pytest.approx(summary["productive_s"])
    assert m["trainer_wall_seconds"] == pytest.approx(summary["wall_s"])
    assert m["trainer_run_completed"] == 1.0
    assert m["trainer_steps_total"] == summary["steps_executed"] == 5
    assert m["trainer_steps_recomputed_total"] == summary["steps_recomputed"] == 1
    assert m["trainer_tokens_total"] == summary["tokens"]
    assert m["trainer_last_step"] == 3 and m["trainer_world_size"] == 2
    (fault,) = summary["faults"]
    assert m["trainer_faults_total{kind=exception}"] == 1
    assert m["trainer_faults_recovered_total{kind=exception,tier=1}"] == 1
    assert m["trainer_recovery_seconds_sum{kind=exception,tier=1}"] == pytest.approx(fault["mttr_s"])
    assert m["trainer_recovery_seconds_count{kind=exception,tier=1}"] == 1
    assert m["trainer_recovery_seconds_bucket{kind=exception,le=1.0,tier=1}"] == 0  # mttr 1.3 s
    assert m["trainer_recovery_seconds_bucket{kind=exception,le=2.0,tier=1}"] == 1
    detection = m["trainer_fault_detection_seconds_sum{kind=exception,tier=1}"]
    assert detection == pytest.approx(fault["detection_s"])
    assert m["trainer_fault_detections_total{tier=1}"] == 1  # rank 0's detection only
    assert m["trainer_restores_total"] == 1  # the fresh start restored nothing
    # The stall of a save is its slowest rank's, as in the summary.
    assert m["trainer_checkpoint_stall_seconds_sum"] == pytest.approx(summary["ckpt"]["stall_s"]["total"])
    assert m["trainer_checkpoint_stall_seconds_sum"] == pytest.approx(0.4)
    assert m["trainer_checkpoint_saves_total"] == 1 and m["trainer_checkpoint_commits_total"] == 1
    assert m["trainer_checkpoint_failures_total"] == summary["ckpt"]["failed"] == 1
    assert m["trainer_last_checkpoint_timestamp_seconds"] == 103.4 and m["trainer_last_checkpoint_step"] == 1
    # A finished run has no age: the "no progress" and "checkpoint age" alarms must not fire on it.
    assert "trainer_seconds_since_last_step" not in m and "trainer_seconds_since_last_checkpoint" not in m
    assert m["trainer_exporter_info{rank=0}"] == 1


def test_a_running_run_decays_goodput_with_wall_time(tmp_path: Path) -> None:
    _write_run(tmp_path, completed=False)
    now = [110.0]
    collector = RunCollector(tmp_path, rank=0, clock=lambda: now[0])
    m = {s.name: s.value for f in collector.collect() for s in f.samples if not s.labels}
    productive = summarize(tmp_path)["productive_s"]
    assert m["trainer_goodput_ratio"] == pytest.approx(productive / 10.0)  # first event at 100
    assert m["trainer_seconds_since_last_step"] == pytest.approx(110.0 - 107.5)
    assert m["trainer_seconds_since_last_checkpoint"] == pytest.approx(110.0 - 103.4)
    assert m["trainer_run_completed"] == 0
    assert "trainer_goodput_last_hour_ratio" not in m  # the run is not an hour old yet
    now[0] = 200.0  # a hang: nothing is written, the live figures still move
    m = {s.name: s.value for f in collector.collect() for s in f.samples if not s.labels}
    assert m["trainer_goodput_ratio"] == pytest.approx(productive / 100.0)
    assert m["trainer_seconds_since_last_step"] == pytest.approx(200.0 - 107.5)
    now[0] = 3701.5  # an hour later: the window [101.5, 3701.5] holds half of step 0 and 3 kept steps
    m = {s.name: s.value for f in collector.collect() for s in f.samples if not s.labels}
    assert m["trainer_goodput_last_hour_ratio"] == pytest.approx(3.5 / 3600)


def test_the_tail_reads_only_complete_lines_and_counts_torn_ones(tmp_path: Path) -> None:
    path = tmp_path / "events.rank0.jsonl"
    full = _lines(0, RANK0[:3])
    path.write_text(full + full[:20])  # the last line is still being written
    tail = EventTail(tmp_path)
    tail.poll()
    assert tail.fold.work.lines_parsed == 3 and tail.fold.steps_executed == 1 and tail.bad == 0
    with open(path, "a") as fh:  # the writer died mid-line; its restarted process appends whole lines
        fh.write("\n" + _lines(0, RANK0[3:4]))
    tail.poll()
    assert tail.fold.steps_executed == 2 and tail.fold.work.lines_parsed == 5 and tail.bad == 1
    assert summarize(tmp_path)["unreadable_lines"] == tail.bad


def test_only_global_rank_0_exports_the_run_and_a_taken_port_is_not_fatal(tmp_path: Path) -> None:
    _write_run(tmp_path, completed=False)
    other = RunCollector(tmp_path, rank=3)
    assert [f.name for f in other.collect()] == ["trainer_exporter_info"]
    assert MetricsServer.maybe_start(tmp_path, 0, rank=0, local_rank=0) is None  # port 0: off
    assert MetricsServer.maybe_start(tmp_path, 9, rank=1, local_rank=1) is None  # one endpoint per node
    first = MetricsServer(tmp_path, 0, rank=0, addr="0.0.0.0")
    try:
        assert MetricsServer.maybe_start(tmp_path, first.port, rank=0, local_rank=0) is None
    finally:
        first.close()


def test_linger_returns_at_the_next_scrape(tmp_path: Path) -> None:
    _write_run(tmp_path, completed=True)
    server = MetricsServer(tmp_path, 0, rank=0, addr="127.0.0.1")
    try:
        assert server.linger(0.2) is False  # nobody scraped
        result: list[bool] = []
        waiter = threading.Thread(target=lambda: result.append(server.linger(30)))
        waiter.start()
        while waiter.is_alive() and not result:
            _scrape(server.port)
            waiter.join(timeout=0.05)
        assert result == [True]
    finally:
        server.close()


def _straggler(step: int, node: int, score: float, action: str) -> tuple[str, float, dict[str, Any]]:
    fields = {"step": step, "node": node, "ranks": [node], "score": score, "history": 2.9}
    reason = "a hot spare stands by" if action == "evict" else "no hot spare stands by"
    return ("straggler", 100.0 + step, {**fields, "policy": "evict", "action": action, "reason": reason})


def test_stragglers_are_counted_by_action_as_the_summary_lists_them(tmp_path: Path) -> None:
    tmp_path.mkdir(exist_ok=True)
    (tmp_path / "events.rank0.jsonl").write_text(_lines(0, RANK0 + END))
    # Written by the straggling node's local rank 0, whichever rank that is.
    found = [_straggler(2, 1, 3.1, "report"), _straggler(3, 1, 2.7, "evict")]
    (tmp_path / "events.rank1.jsonl").write_text(_lines(1, RANK1 + found))
    summary = summarize(tmp_path)
    assert [(s["step"], s["node"], s["action"]) for s in summary["stragglers"]] == [
        (2, 1, "report"),
        (3, 1, "evict"),
    ]
    server = MetricsServer(tmp_path, 0, rank=0, addr="127.0.0.1")
    try:
        m = _scrape(server.port)
    finally:
        server.close()
    assert m["trainer_stragglers_total{action=report}"] == 1
    assert m["trainer_stragglers_total{action=evict}"] == 1
    assert m["trainer_straggler_score"] == summary["stragglers"][-1]["score"] == 2.7
