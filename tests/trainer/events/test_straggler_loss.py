"""The straggler's cost in the run summary (trainer/events/metrics.py), from hand-written event files: the
kept steps' wait for a straggling node is the `straggler` loss term, not productive time; an eviction's
downtime is the `eviction` term; a `slow` fault stops nothing (no recovery time, no step in flight)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.trainer.events.events import event as _ev
from trainer.events.metrics import summarize, summarize_events
from trainer.events.metrics_fold import RunFold


def _step(step: int, t0: float, t1: float, restart: int = 0, straggler_s: float = 0.0) -> dict[str, Any]:
    fields = {
        "step": step,
        "t_start": t0,
        "t_end": t1,
        "loss": 2.0,
        "tokens": 100,
        "straggler_s": straggler_s,
    }
    return _ev("step", t1, 0, restart, **fields)


def _straggler(t: float, step: int, action: str) -> dict[str, Any]:
    reason = "a hot spare stands by" if action == "evict" else "policy is report"
    fields = {"step": step, "node": 1, "ranks": [2, 3], "score": 3.0, "history": 1.0, "policy": action}
    return _ev("straggler", t, 2, action=action, reason=reason, **fields)


def _write(out: Path, events: list[dict[str, Any]]) -> Path:
    for rank in sorted({int(e["rank"]) for e in events}):
        lines = [json.dumps(e) for e in events if int(e["rank"]) == rank]
        (out / f"events.rank{rank}.jsonl").write_text("\n".join(lines) + "\n")
    return out


def _reported_run() -> list[dict[str, Any]]:
    """Four 1 s steps, then a slow fault at step 4 (injected 0.2 s into it): steps 4-7 take 3 s, of which
    each waited 2 s for node 1; node 1 reported at step 6, never evicted."""
    events = [
        _ev("run_start", 0.0, world_size=4, config={}),
        _ev("restore", 0.5, step=-1, path=None, load_s=0),
    ]
    t = 1.0
    for step in range(4):
        events.append(_step(step, t, t + 1.0))
        t += 1.0
    events.append(_ev("fault_injected", t + 0.2, 2, fault="slow", step=4))
    for step in range(4, 8):
        events.append(_step(step, t, t + 3.0, straggler_s=2.0))
        if step == 6:
            events.append(_straggler(t + 3.0, 6, "report"))
        t += 3.0
    events.append(_ev("run_end", t + 0.5, step=7, status="completed"))
    return sorted(events, key=lambda e: e["t"])


def test_a_reported_stragglers_wait_is_lost_time_not_productive(tmp_path: Path) -> None:
    s = summarize(_write(tmp_path, _reported_run()))
    loss = s["loss_s"]
    assert loss["straggler"] == pytest.approx(4 * 2.0)
    # 4 x 1 s + 4 x 3 s of steps, of which 8 s were the wait: the job did 8 s of its own work in 17.5 s
    assert s["productive_s"] == pytest.approx(16.0 - 8.0)
    assert s["training_efficiency"] == pytest.approx(8.0 / 17.5)
    named = s["productive_s"] + sum(loss["recovery"]) + sum(v for k, v in loss.items() if k != "recovery")
    assert named == pytest.approx(s["wall_s"]) and loss["other"] == pytest.approx(0.0, abs=1e-9)


def test_a_slow_fault_stops_nothing_and_is_detected_when_the_watch_names_its_node(tmp_path: Path) -> None:
    s = summarize(_write(tmp_path, _reported_run()))
    (fault,) = s["faults"]
    assert fault["type"] == "slow" and fault["mttr_s"] is None and fault["tier"] is None
    assert fault["detection_s"] == pytest.approx(14.0 - 5.2)  # injected at 5.2, step 6 ended at 14.0
    assert fault["found_at_step"] == 6 and fault["recovered"]
    # no recovery window, and the step it fired in is kept whole (nothing of it was redone)
    assert s["loss_s"]["recovery"] == [] and s["loss_s"]["recompute"] == 0.0


def test_an_eviction_costs_its_downtime_and_the_steps_it_redid(tmp_path: Path) -> None:
    """Node 1 slow from step 2, found and evicted at step 3 (its first execution ends at 7.0); the workers
    restart, restore step 2 at 9.0 and resume at 9.5 at full pace."""
    events = [
        _ev("run_start", 0.0, world_size=4, config={}),
        _ev("restore", 0.5, step=-1, path=None, load_s=0.0),
        _step(0, 1.0, 2.0),
        _step(1, 2.0, 3.0),
        _ev("fault_injected", 3.1, 2, fault="slow", step=2),
        _step(2, 3.0, 5.0, straggler_s=1.0),
        _step(3, 5.0, 7.0, straggler_s=1.0),
        _straggler(7.05, 3, "evict"),
        _ev("restore", 9.0, restart=1, step=2, path=None, load_s=0.1, source="shm"),
        _ev("restore", 9.01, 2, restart=1, step=2, path=None, load_s=0.1, source="peer"),
        _step(3, 9.5, 10.5, restart=1),
        _step(4, 10.5, 11.5, restart=1),
        _ev("run_end", 12.0, restart=1, step=4, status="completed"),
    ]
    s = summarize(_write(tmp_path, events))
    (evicted,) = s["evictions"]
    assert evicted["down_s"] == pytest.approx(9.5 - 7.0)
    assert (evicted["restored_step"], evicted["steps_recomputed"]) == (2, 1)
    loss = s["loss_s"]
    assert loss["eviction"] == pytest.approx(2.5)
    assert loss["straggler"] == pytest.approx(1.0)  # step 2's; step 3's slow run was redone (recompute)
    assert loss["recompute"] == pytest.approx(2.0)
    assert s["productive_s"] == pytest.approx(6.0 - 1.0)
    named = s["productive_s"] + sum(loss["recovery"]) + sum(v for k, v in loss.items() if k != "recovery")
    assert named == pytest.approx(s["wall_s"]) and loss["other"] == pytest.approx(0.0, abs=1e-9)
    # The slow fault's report says where its node's eviction restored from, and what it redid.
    (slow,) = s["faults"]
    assert (slow["mttr_s"], slow["restored_step"], slow["steps_recomputed"]) == (None, 2, 1)
    assert slow["restored_by_source"] == {"shm": [0], "peer": [2]}
    assert slow["detection_s"] == pytest.approx(7.05 - 3.1) and slow["found_at_step"] == 3
    fold = RunFold((1.0,), retain_s=float("inf"))
    for e in sorted(events, key=lambda e: e["t"]):
        fold.add(e)
    fold.settle()
    ((restored, redone),) = [(f["restored_step"], f["steps_recomputed"]) for f in fold.fault_reports()]
    assert (restored, redone) == (2, 1) and fold.kept_productive == pytest.approx(s["productive_s"])


def test_an_eviction_the_run_never_recovered_from_has_no_downtime(tmp_path: Path) -> None:
    events = [_step(0, 1.0, 2.0), _straggler(2.1, 0, "evict")]
    (evicted,) = summarize(_write(tmp_path, events))["evictions"]
    assert evicted["down_s"] is None and summarize(tmp_path)["loss_s"]["eviction"] == 0.0


def test_a_steps_wait_is_bounded_by_its_duration_and_absent_from_old_logs() -> None:
    events = [_step(0, 1.0, 2.0, straggler_s=5.0), _step(1, 2.0, 3.0, straggler_s=-1.0)]
    del events[1]["straggler_s"]  # a log written before the field
    s = summarize_events(events)
    assert s["loss_s"]["straggler"] == pytest.approx(1.0) and s["productive_s"] == pytest.approx(1.0)


def test_the_live_fold_counts_the_wait_as_the_summary_does(tmp_path: Path) -> None:
    events = _reported_run()
    fold = RunFold((1.0,), retain_s=float("inf"))
    for e in events:
        fold.add(e)
    fold.settle()
    s = summarize(_write(tmp_path, events))
    assert fold.kept_productive == pytest.approx(s["productive_s"])
    ((kind, mttr, detection),) = [(f["type"], f["mttr_s"], f["detection_s"]) for f in fold.fault_reports()]
    assert (kind, mttr) == ("slow", None) and detection == pytest.approx(s["faults"][0]["detection_s"])
