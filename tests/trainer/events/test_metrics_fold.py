"""The exporter's incremental fold (trainer/events/metrics_fold.py) gives summary.json's figures, and a scrape
costs what was appended: measured as work done (lines parsed, records held), never as wall time."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.scale_events import Fault, write_run
from trainer.events.metrics import summarize
from trainer.events.metrics_export import EventTail, fold_families
from trainer.events.metrics_fold import RunFold

FAULTS = [Fault(57, "exception", 3), Fault(140, "sigkill", 1), Fault(233, "exception", 0)]


def _figures(fold: RunFold) -> dict[str, Any]:
    return {
        "productive_s": pytest.approx(fold.kept_productive),
        "steps_executed": fold.steps_executed,
        "steps_recomputed": fold.steps_executed - fold.kept_count,
        "tokens": fold.kept_tokens,
        "saves": len(fold.saves),
        "stall": pytest.approx(sum(s["blocked_s"] for s in fold.per_save())),
        "commits": fold.commits,
        "faults": [
            (f["type"], f["tier"], f["detection_s"], f["mttr_s"], f["steps_recomputed"], f["recovered"])
            for f in fold.fault_reports()
        ],
    }


def _summary_figures(out: Path) -> dict[str, Any]:
    s = summarize(out)
    return {
        "productive_s": s["productive_s"],
        "steps_executed": s["steps_executed"],
        "steps_recomputed": s["steps_recomputed"],
        "tokens": s["tokens"],
        "saves": s["ckpt"]["saves"],
        "stall": s["ckpt"]["stall_s"]["total"],
        "commits": s["ckpt"]["commits"],
        "faults": [
            (f["type"], f["tier"], f["detection_s"], f["mttr_s"], f["steps_recomputed"], f["recovered"])
            for f in s["faults"]
        ],
    }


@pytest.mark.parametrize("retain_s", [float("inf"), 200.0])
def test_the_fold_polled_in_pieces_equals_the_summary(tmp_path: Path, retain_s: float) -> None:
    """Folded while the run is written, with a window far shorter than the run (steps leave it, fault
    reports freeze), the figures are summary.json's."""
    tail = EventTail(tmp_path)
    tail.fold.retain_s = retain_s
    t = 1_000_000.0
    for first in range(0, 300, 60):  # written in five pieces, polled after each
        faults = [f for f in FAULTS if first <= f.step < first + 60]
        t = write_run(tmp_path, ranks=4, steps=60, first_step=first, t0=t, faults=faults,
                      completed=first == 240, start=first == 0)  # fmt: skip
        tail.poll()
    assert [f[0] for f in _figures(tail.fold)["faults"]] == ["exception", "sigkill", "exception"]
    assert _figures(tail.fold) == _summary_figures(tmp_path)
    assert tail.fold.work.rebuilds == 0
    if retain_s != float("inf"):
        assert len(tail.fold.frozen) >= 2 and len(tail.fold.retained) <= 21


def _copy_until(src: Path, dst: Path, until: float) -> None:
    """Append to dst the lines of src's event files up to time `until` (a run seen while written)."""
    dst.mkdir(exist_ok=True)
    for path in sorted(src.glob("events.rank*.jsonl")):
        lines = path.read_text().splitlines(keepends=True)
        have = (dst / path.name).read_text().count("\n") if (dst / path.name).exists() else 0
        new = [ln for ln in lines[have:] if json.loads(ln)["t"] <= until]
        with open(dst / path.name, "a") as fh:
            fh.writelines(new)


def test_a_rollback_older_than_the_window_rebuilds_exactly(tmp_path: Path) -> None:
    """A fault at step 190 rolls back to the commit of step 99, far older than the 10-step window: the
    fold re-reads rank 0's file once and its figures stay the summary's."""
    write_run(tmp_path / "src", ranks=2, steps=210, snapshot_every=0, faults=[Fault(190, "sigkill", 1)])
    live = tmp_path / "live"
    tail = EventTail(live)
    tail.fold.retain_s = 100.0
    t_fault = 1_000_001.0 + 190 * 10.05
    for until in (t_fault - 1.0, t_fault + 50.0, float("inf")):
        _copy_until(tmp_path / "src", live, until)
        tail.poll()
    assert tail.fold.work.rebuilds == 1
    assert _figures(tail.fold) == _summary_figures(live)
    assert _figures(tail.fold)["steps_recomputed"] == 90  # steps 100..189 again


def _scrape_cost(out: Path, steps: int, ranks: int) -> tuple[int, int]:
    """Lines parsed by a scrape after one more step of every rank, and records held, after `steps`."""
    tail = EventTail(out)
    t = write_run(out, ranks=ranks, steps=steps, completed=False)
    tail.poll()
    before = tail.fold.work.lines_parsed + tail.fold.work.records_visited
    write_run(out, ranks=ranks, steps=1, first_step=steps, t0=t, completed=False, start=False)
    list(fold_families(tail.fold, t + 200))
    tail.poll()
    list(fold_families(tail.fold, t + 200))
    after = tail.fold.work.lines_parsed + tail.fold.work.records_visited
    return after - before, tail.fold.held()


def test_a_scrape_after_8x_the_steps_costs_and_holds_at_most_1_5x(tmp_path: Path) -> None:
    """10 s steps: both runs are longer than the hour window, so what a scrape holds is the window."""
    cost_1, held_1 = _scrape_cost(tmp_path / "short", 600, ranks=8)
    cost_8, held_8 = _scrape_cost(tmp_path / "long", 4800, ranks=8)
    assert cost_1 > 0 and held_1 > 0
    assert cost_8 <= 1.5 * cost_1, (cost_1, cost_8)
    assert held_8 <= 1.5 * held_1, (held_1, held_8)
