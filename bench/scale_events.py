"""Synthetic event files in the trainer's format (Contract 3), for runs far larger than this machine trains.

`write_run` lays out what a run of `ranks` ranks x `steps` steps writes: rank 0's `step` events, every
rank's `run_start` and `restore`, each node's `snapshot`/`replica` (every `snapshot_every` steps), every
rank's `ckpt_save` and rank
0's `ckpt_commit` (every `ckpt_every` steps), and faults: each one is injected on a rank, detected by
every rank, restored to the last snapshot or commit and its steps redone. Times are exact multiples of
`step_s`, so the figures are predictable. The lines are the ones `trainer.events.metrics.EventLog` writes
(same keys; only `t`/`pid` are synthetic).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from trainer.config.components import default_of
from trainer.state.cadence import is_due


@dataclass(frozen=True)
class Fault:
    step: int  # injected during this step
    kind: str  # exception (tier 1: same pid, next iteration) or sigkill (tier 2: new pids)
    rank: int


CKPT_INTERVAL: int = default_of("ckpt.interval_steps")
"""The trainer's checkpoint interval (its one default, which the chart renders too)."""


def _line(ev: str, t: float, rank: int, pid: int, restart: int, iteration: int, **fields: Any) -> str:
    record = {"ev": ev, "t": t, "rank": rank, "pid": pid, "restart": restart, "iteration": iteration}
    record.update(fields)
    return json.dumps(record) + "\n"


class _Run:
    def __init__(self, out: Path, ranks: int, step_s: float, t0: float) -> None:
        out.mkdir(parents=True, exist_ok=True)
        self.ranks = ranks
        self.files: list[TextIO] = [open(out / f"events.rank{r}.jsonl", "a") for r in range(ranks)]  # noqa: SIM115
        self.step_s = step_s
        self.t = t0
        self.restart = 0
        self.iteration = 0

    def pid(self, rank: int) -> int:
        return 1000 + rank + 100_000 * self.restart

    def emit(self, rank: int, ev: str, t: float, **fields: Any) -> None:
        self.files[rank].write(_line(ev, t, rank, self.pid(rank), self.restart, self.iteration, **fields))

    def all(self, ev: str, t: float, **fields: Any) -> None:
        for r in range(self.ranks):
            self.emit(r, ev, t, **fields)

    def close(self) -> None:
        for fh in self.files:
            fh.close()


def write_run(
    out: str | Path,
    *,
    ranks: int,
    steps: int,
    step_s: float = 10.0,
    snapshot_every: int = 10,
    ckpt_every: int = CKPT_INTERVAL,
    faults: Sequence[Fault] = (),
    t0: float = 1_000_000.0,
    ranks_per_node: int = 8,
    per_rank_snapshots: bool = False,
    first_step: int = 0,
    completed: bool = True,
    start: bool = True,
) -> float:
    """Append a run (or, with start=False and first_step > 0, more of one) to `out`; returns its end time.

    `snapshot`/`replica` events come from each node's local rank 0 (Contract 3), or from every rank with
    `per_rank_snapshots` (every rank writing its own, for comparison)."""
    run = _Run(Path(out), ranks, step_s, t0)
    samplers = range(ranks) if per_rank_snapshots else range(0, ranks, ranks_per_node)
    by_step = {f.step: f for f in faults}
    if start:
        run.all("run_start", run.t, world_size=ranks, config={}, forked=True)
        run.all("restore", run.t + 0.5, step=-1, path="", load_s=0.0, source="none")
        run.t += 1.0
    saved, snapped = -1, -1
    step = first_step
    end = first_step + steps
    while step < end:
        t_start, t_end = run.t, run.t + step_s
        fault = by_step.pop(step, None)
        if fault is not None:
            run.emit(fault.rank, "fault_injected", t_start + step_s / 2, fault=fault.kind, step=step)
            tier = 1 if fault.kind == "exception" else 2
            run.all("fault_detected", t_start + step_s / 2 + 0.5, tier=tier, reason=fault.kind)
            if tier == 1:
                run.iteration += 1
            else:
                run.restart += 1
            back = max(saved, snapped)
            t = t_start + step_s
            run.all("run_start", t, world_size=ranks, config={}, forked=True)
            source = "memory" if back == snapped and back >= 0 else "fsx"
            run.all("restore", t + 0.5, step=back, path="", load_s=0.5, source=source)
            run.t = t + 1.0
            step = back + 1
            continue
        run.emit(0, "step", t_end, step=step, t_start=t_start, t_end=t_end, loss=2.0, tokens=4096)
        if is_due(step, snapshot_every):
            for r in samplers:
                run.emit(r, "snapshot", t_end + 0.01, step=step, blocked_s=0.01, copy_s=0.05, bytes=1 << 20)
            for r in samplers:
                run.emit(r, "replica", t_end + 0.2, step=step, holder=(r + 8) % ranks, bytes=1 << 20,
                         send_s=0.1, ok=True)  # fmt: skip
            snapped = step
        if is_due(step, ckpt_every):
            run.all("ckpt_save", t_end + 0.02, step=step, blocked_s=0.2, mode="async", bytes=1 << 22)
            run.emit(0, "ckpt_commit", t_end + 1.0, step=step, path=f"ckpt/step_{step}", total_s=1.0)
            saved = step
        run.t = t_end + 0.05
        step += 1
    if completed:
        run.all("run_end", run.t, step=end - 1, status="completed")
    run.close()
    return run.t
