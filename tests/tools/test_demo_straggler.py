"""`make demo-straggler`'s table and exit status (tools/demo_straggler.py) from hand-written reports: no
training run (the three runs are the demo's, measured by hand: docs/history.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tools import demo_straggler
from tools.demo_straggler import problems, row, table


def _report(
    wall: float, eff: float, actions: tuple[str, ...] = (), down: float | None = None, waited: float = 0.0
) -> dict[str, Any]:
    stragglers = [{"step": 7 + 8 * i, "node": 1, "action": a} for i, a in enumerate(actions)]
    evictions = [{"step": 7, "down_s": down, "steps_recomputed": 1}] if "evict" in actions else []
    faults = [{"type": "slow", "detection_s": 2.5}] if actions else []
    return {
        "job_succeeded": True,
        "wall_s": wall,
        "training_efficiency": eff,
        "loss_breakdown_s": {"straggler": waited, "eviction": down or 0.0},
        "stragglers": stragglers,
        "evictions": evictions,
        "faults": faults,
    }


RUNS = {
    "fault-free": _report(43.5, 0.941),
    "evicted": _report(55.0, 0.905, ("evict",), down=1.4, waited=2.6),
    "reported": _report(100.4, 0.52, ("report",) * 7, waited=46.0),
}


def _rows(runs: dict[str, dict[str, Any]] = RUNS) -> list[dict[str, Any]]:
    return [row(name, r) for name, r in runs.items()]


def test_the_table_shows_each_run_and_the_evicted_runs_distance_to_fault_free() -> None:
    lines = table(_rows())
    header, _, free, evicted, reported, gap = lines
    assert header.split()[:4] == ["run", "wall", "efficiency", "straggler"]
    assert free.split()[:3] == ["fault-free", "43.5", "s"] and "94.1 %" in free and free.endswith("-")
    assert "90.5 %" in evicted and "1.40 s" in evicted and "step 7 (2.5 s after)" in evicted
    assert evicted.endswith("evict (1 step(s) recomputed)")
    assert "46.0 s" in reported and reported.endswith("report")
    assert gap.startswith("evicted: 3.6 points below fault-free (NOT within the target of 3)")
    assert "wall +11.5 s" in gap


def test_runs_that_did_what_they_show_exit_0() -> None:
    assert problems(_rows()) == []


@pytest.mark.parametrize(
    ("name", "report", "complaint"),
    [
        ("fault-free", _report(43.5, 0.94, ("report",)), "found in a run without one"),
        ("evicted", _report(90.0, 0.6, ("report",)), "was not evicted (report)"),
        ("evicted", _report(90.0, 0.6), "was not evicted (not found)"),
        ("reported", _report(60.0, 0.9, ("evict",), down=1.0), "not only reported (evict)"),
        ("reported", {**RUNS["reported"], "job_succeeded": False}, "did not succeed"),
    ],
)
def test_a_run_that_did_something_else_is_named(name: str, report: dict[str, Any], complaint: str) -> None:
    (problem,) = problems(_rows({**RUNS, name: report}))
    assert problem.startswith(f"{name}: ") and complaint in problem


def test_main_runs_the_three_overlays_on_one_synthesis_and_exits_on_problems(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    synthesized: list[Path] = []
    ran: list[tuple[list[str], list[str]]] = []
    outcome = dict(RUNS)

    def run_demo(release: Any, values: list[Path], sets: list[str], out: Path, timeout: float) -> Any:
        ran.append(([p.name for p in values], sets))
        return True, outcome[out.name]

    monkeypatch.setattr(demo_straggler.demo, "default_team", lambda path: {"name": "t"})
    monkeypatch.setattr(demo_straggler.demo, "synthesize", lambda *a: synthesized.append(a[2]) or {})
    monkeypatch.setattr(demo_straggler.demo, "run_demo", run_demo)
    assert demo_straggler.main(["--out", str(tmp_path / "o")]) == 0
    assert len(synthesized) == 1
    assert ran == [
        (["demo-values.yaml", "demo-fault-free.yaml"], []),
        (["demo-values.yaml", "demo-straggler.yaml"], []),
        (["demo-values.yaml", "demo-straggler.yaml"], ["stragglerPolicy=report"]),
    ]
    assert "evicted: 3.6 points below fault-free" in capsys.readouterr().out
    outcome["evicted"] = _report(90.0, 0.6, ("report",))
    assert demo_straggler.main(["--out", str(tmp_path / "o")]) == 1


def test_the_demo_report_names_the_eviction_and_the_wait_and_pairs_each_recovery_with_its_fault() -> None:
    from tools.demo import STRAGGLER_NAME, describe_stragglers, handled_by, loss_terms

    found = {"step": 7, "node": 1, "score": 2.9, "history": 1.0, "action": "evict", "reason": "a hot spare"}
    evicted = [{"step": 7, "down_s": 1.25, "restored_step": 6, "steps_recomputed": 1}]
    lines = describe_stragglers([found], evicted, {"straggler": 2.5})
    assert len(lines) == 3 and "stopped 1.25 s, resumed from step 6, 1 step(s) recomputed" in lines[1]
    assert "waited 2.50 s for a straggling node" in lines[2]
    assert describe_stragglers([found], [], {"straggler": 0.0}) == lines[:1]
    assert handled_by({"tier": None, "type": "slow"}) == STRAGGLER_NAME
    # the slow fault has no recovery: the node loss after it keeps its own
    summary = {
        "faults": [
            {"type": "slow", "step": 5, "mttr_s": None},
            {"type": "node-loss", "step": 30, "mttr_s": 1.5},
        ],
        "loss_s": {"startup": 0.3, "recovery": [1.5], "straggler": 2.5, "eviction": 1.25, "other": 0.1},
    }
    terms = loss_terms(summary)
    assert terms["recovery:node-loss@30"] == 1.5 and not any(k.startswith("recovery:slow") for k in terms)
    assert (terms["straggler"], terms["eviction"]) == (2.5, 1.25)
