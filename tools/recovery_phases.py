"""Where the time of a tier-2 recovery goes: the trainer's events joined with ft_launcher's own profiling
events, read from each local pod's launcher log.

NVRx >= 0.7's launcher logs one line per profiling event, with its own UTC time:
"... Cycle: 1 Event: failure_detected Node: localhost_609_0 Rank: 0 Time: 2026-11-30 07:47:20.132 UTC".
Joined with the trainer's events (Contract 3: fault_injected, fault_detected, run_start, restore, step),
a recovery splits into consecutive phases that add up to the fault's MTTR:

    detect       fault -> the first survivor's fault_detected (its Wrapper, or the launcher's own
                 worker check when tier 1 is off: then this phase is folded into the next)
    notice       -> the first launcher's failure_detected (its monitor interval)
    rendezvous   -> the last launcher's rendezvous_completed of that cycle (stopping the workers,
                 waiting for the round to open, the round itself, admitting a spare)
    start        -> every rank's run_start (process start, Python and torch imports, process groups)
    restore      -> every rank's restore event (agreeing on a step, loading it)
    first step   -> the first step's start after the fault
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

_EVENT = re.compile(
    r"Cycle: (\d+) Event: (\w+) Node: (\S+) Rank: \S+ Time: (\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(?:\.\d+)?) UTC"
)
PHASES = ("detect", "notice", "rendezvous", "start", "restore", "first_step")


@dataclass(frozen=True)
class LauncherEvent:
    """One profiling event of one pod's launcher: its cycle (rendezvous round), kind and unix time."""

    pod: str
    cycle: int
    kind: str
    t: float


def launcher_events(log_dir: Path) -> list[LauncherEvent]:
    """Every profiling event of every `pod-<index>.log` in `log_dir`, oldest first."""
    found = []
    for path in sorted(log_dir.glob("pod-*.log")):
        for line in path.read_text(errors="replace").splitlines():
            if m := _EVENT.search(line):
                stamp = datetime.strptime(
                    m[4], "%Y-%m-%d %H:%M:%S.%f" if "." in m[4] else "%Y-%m-%d %H:%M:%S"
                )
                t = stamp.replace(tzinfo=UTC).timestamp()
                found.append(LauncherEvent(path.stem, int(m[1]), m[2], t))
    return sorted(found, key=lambda e: e.t)


def phases(
    events: Sequence[dict[str, Any]], launcher: Sequence[LauncherEvent], t_fault: float
) -> dict[str, float] | None:
    """The phases (seconds, in PHASES order) of the recovery from the fault at `t_fault`; None when it
    was not a launcher restart or did not finish (no failure_detected, no step after it)."""
    after = [e for e in events if float(e["t"]) >= t_fault]
    steps = [e for e in after if e["ev"] == "step" and float(e["t_start"]) >= t_fault]
    failure = next((e for e in launcher if e.t >= t_fault and e.kind == "failure_detected"), None)
    if failure is None or not steps:
        return None
    t_step = min(float(e["t_start"]) for e in steps)
    if failure.t > t_step:
        return None  # recovered before any launcher saw a failure: tier 1, not a restart
    cycle = failure.cycle
    rdzv = [
        e.t for e in launcher if e.cycle == cycle and e.kind == "rendezvous_completed" and e.t >= failure.t
    ]
    starts = _first_per_rank(after, "run_start", t_step)
    restores = _first_per_rank(after, "restore", t_step)
    if not rdzv or not starts or not restores:
        return None
    detected = [float(e["t"]) for e in after if e["ev"] == "fault_detected" and float(e["t"]) <= failure.t]
    marks = [
        t_fault,
        min(detected, default=t_fault),
        failure.t,
        max(rdzv),
        max(starts),
        max(restores),
        t_step,
    ]
    # Clocks of separate processes: a mark a few ms before the previous one counts as no time.
    for i in range(1, len(marks)):
        marks[i] = max(marks[i], marks[i - 1])
    return {name: marks[i + 1] - marks[i] for i, name in enumerate(PHASES)}


def _first_per_rank(events: Sequence[dict[str, Any]], kind: str, until: float) -> list[float]:
    first: dict[int, float] = {}
    for e in events:
        if e["ev"] == kind and float(e["t"]) <= until:
            first.setdefault(int(e["rank"]), float(e["t"]))
    return list(first.values())


def describe(p: dict[str, float]) -> str:
    """One line: each phase's seconds, in order."""
    return ", ".join(f"{name.replace('_', ' ')} {p[name]:.1f}" for name in PHASES) + " (s)"


def warm_starts(events: Sequence[dict[str, Any]], t_fault: float, t_end: float) -> tuple[int, int]:
    """(forked, all) of the worker processes started between the fault and `t_end`: how many skipped
    the imports because their pod's zygote forked them (run_start's `forked`, trainer/launcher/prefork)."""
    starts = {
        (int(e["rank"]), int(e["pid"])): bool(e.get("forked"))
        for e in events
        if e["ev"] == "run_start" and t_fault <= float(e["t"]) <= t_end and int(e.get("iteration", 0)) == 0
    }
    return sum(starts.values()), len(starts)
