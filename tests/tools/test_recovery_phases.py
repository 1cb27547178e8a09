"""tools/recovery_phases.py: a tier-2 recovery split into phases from events and NVRx 0.7 launcher lines."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from tools.recovery_phases import PHASES, describe, launcher_events, phases, warm_starts

T0 = datetime(2026, 11, 30, 7, 47, 18, tzinfo=UTC).timestamp()


def _profiling(cycle: int, kind: str, at: float) -> str:
    stamp = datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    return (
        f"2026-11-30 07:00:00,000 [INFO] [vm] [workload:?(?) infra:?(?)] profiling.py:93   - Cycle: {cycle} "
        f"Event: {kind} Node: localhost_609_0 Rank: 0 Time: {stamp} UTC\n"
    )


def test_a_node_loss_recovery_splits_into_phases_that_add_up_to_its_mttr(tmp_path: Path) -> None:
    (tmp_path / "pod-0.log").write_text(
        _profiling(0, "rendezvous_completed", T0 - 100)  # the first round: not this recovery's
        + _profiling(1, "failure_detected", T0 + 1.5)
        + _profiling(1, "rendezvous_completed", T0 + 4.0)
    )
    (tmp_path / "pod-1.log").write_text(_profiling(1, "rendezvous_completed", T0 + 4.5))
    events = [
        {"ev": "fault_injected", "t": T0 + 0.0, "rank": 2},
        {"ev": "fault_detected", "t": T0 + 1.0, "rank": 0},
        {"ev": "run_start", "t": T0 + 7.0, "rank": 0},
        {"ev": "run_start", "t": T0 + 7.5, "rank": 1},
        {"ev": "restore", "t": T0 + 9.0, "rank": 1},
        {"ev": "restore", "t": T0 + 9.5, "rank": 0},
        {"ev": "step", "t": T0 + 11.0, "t_start": T0 + 10.0, "rank": 0},
    ]
    launcher = launcher_events(tmp_path)
    assert [e.kind for e in launcher][-3:] == [
        "failure_detected",
        "rendezvous_completed",
        "rendezvous_completed",
    ]
    p = phases(events, launcher, T0)
    assert p is not None and tuple(p) == PHASES
    expected = {
        "detect": 1.0,
        "notice": 0.5,
        "rendezvous": 3.0,
        "start": 3.0,
        "restore": 2.0,
        "first_step": 0.5,
    }
    assert all(abs(p[k] - v) < 2e-3 for k, v in expected.items()), p
    assert abs(sum(p.values()) - 10.0) < 2e-3
    assert describe(p).startswith("detect 1.0, notice 0.5, rendezvous 3.0")


def test_an_in_process_recovery_has_no_launcher_phases(tmp_path: Path) -> None:
    # The launcher's failure comes after training resumed: it belongs to a later fault.
    (tmp_path / "pod-0.log").write_text(_profiling(1, "failure_detected", T0 + 30))
    events = [
        {"ev": "fault_detected", "t": T0 + 1.0, "rank": 0},
        {"ev": "step", "t": T0 + 3.0, "t_start": T0 + 2.0, "rank": 0},
    ]
    assert phases(events, launcher_events(tmp_path), T0) is None


def test_warm_starts_count_each_new_worker_process_of_the_recovery_once() -> None:
    def start(t: float, rank: int, pid: int, forked: bool, iteration: int = 0) -> dict[str, object]:
        return {
            "ev": "run_start",
            "t": T0 + t,
            "rank": rank,
            "pid": pid,
            "iteration": iteration,
            "forked": forked,
        }

    events = [
        start(-50, 0, 10, False),  # the first start, before the fault
        start(5, 0, 20, True),
        start(5, 1, 21, True),
        start(6, 2, 22, False),  # a cold start (no zygote yet on a fresh pod)
        start(9, 0, 20, True, iteration=1),  # an in-process restart of a process already counted
        start(99, 1, 30, True),  # a later recovery's
    ]
    assert warm_starts(events, T0, T0 + 10) == (2, 3)
    assert warm_starts(events, T0 + 100, T0 + 110) == (0, 0)
