"""The run's live figures folded incrementally from its event log (what trainer/events/metrics_export.py
exports).

`trainer.events.metrics.summarize_events` recomputes everything from every event; a scrape must not: at 16k
ranks x 100k steps the log holds ~10^9 lines. `RunFold.add(record)` folds one event into running
aggregates, so a scrape costs what was appended since the last one, and the memory it holds is bounded by
the ranks, the faults, restores and checkpoints of the run and the steps of the last hour (the
"goodput of the last hour" window), never by the run's length.

It yields the same figures as the summary (tests/trainer/metrics/ check it against `summarize` on the
same files). What makes that exact:
- every per-save, per-commit, per-fault and per-restore quantity is rare and kept (aggregated per save);
- `step` events come from rank 0 only (Contract 3) and are read from its file in the order written, so
  "the last execution of each step number" is kept as running sums plus the executions of the last
  `retain_s` seconds. A rollback to a step older than the window (a restore from a checkpoint more
  than an hour old), or a fault/detection older than the window, triggers one `rebuild`: rank 0's file
  is read again (counted in `work.lines_parsed`), so the figures stay exact, only that scrape is slow;
  the executions the rollback will redo are then held as (duration, tokens) until they are redone;
- a fault's report is frozen once the steps around it leave the window (then nothing can change it).

`work` counts what the fold did (lines parsed, step records visited, records held) so tests and the
scale benchmark measure cost as work, not wall time.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from trainer.events.metrics import NOT_A_STOP, straggler_wait

RETAIN_S = 3600.0  # rank-0 steps kept in full: the last hour (the window of trainer_goodput_last_hour_ratio)


class Step(NamedTuple):
    """One execution of a step by rank 0, compact."""

    step: int
    t_start: float
    t_end: float
    loss: float
    tokens: int
    pid: int
    iteration: int
    segment: int  # rank 0's restores before it: steps of one segment ran without a restore between
    lost: float = 0.0  # its wait for a straggling node (trainer.events.metrics.straggler_wait)

    @property
    def productive(self) -> float:
        return self.t_end - self.t_start - self.lost


class IntervalSet:
    """A set of ints as sorted disjoint [lo, hi] ranges: steps run in consecutive runs, so it stays tiny."""

    def __init__(self) -> None:
        self.lo: list[int] = []
        self.hi: list[int] = []

    def add(self, n: int) -> None:
        i = bisect.bisect_right(self.lo, n) - 1
        if i >= 0 and self.lo[i] <= n <= self.hi[i]:
            return
        if i >= 0 and self.hi[i] == n - 1:
            self.hi[i] = n
        else:
            i += 1
            self.lo.insert(i, n)
            self.hi.insert(i, n)
        if i + 1 < len(self.lo) and self.lo[i + 1] == self.hi[i] + 1:  # joins the next range
            self.hi[i] = self.hi.pop(i + 1)
            self.lo.pop(i + 1)

    def __contains__(self, n: int) -> bool:
        i = bisect.bisect_right(self.lo, n) - 1
        return i >= 0 and n <= self.hi[i]

    def count_above(self, r: int) -> int:
        return sum(max(0, hi - max(lo, r + 1) + 1) for lo, hi in zip(self.lo, self.hi, strict=True))

    def max(self) -> int | None:
        return self.hi[-1] if self.hi else None

    def __len__(self) -> int:
        return len(self.lo)


@dataclass
class Work:
    """What the fold did: lines parsed, records visited at scrapes, rebuilds of rank 0's steps."""

    lines_parsed: int = 0
    records_visited: int = 0
    rebuilds: int = 0


@dataclass
class Histogram:
    """Cumulative bucket counts and sum of observed values (a Prometheus histogram, kept incrementally)."""

    bounds: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    n: int = 0

    def observe(self, value: float) -> None:
        if not self.counts:
            self.counts = [0] * len(self.bounds)
        for i, bound in enumerate(self.bounds):
            if value <= bound:
                self.counts[i] += 1
        self.total = math.fsum((self.total, value))
        self.n += 1


class RunFold:
    """Running aggregates of one run's events. Feed every parsed record to `add`; read the figures."""

    def __init__(
        self,
        step_buckets: tuple[float, ...],
        *,
        retain_s: float = RETAIN_S,
        reread_rank0: Callable[[], Iterable[dict[str, Any]]] | None = None,
    ) -> None:
        self.retain_s = retain_s
        self.reread_rank0 = reread_rank0  # rank 0's events from its file's start (a rebuild)
        self.work = Work()
        self.bad = 0
        self.first_t: float | None = None
        self.last_t: float | None = None
        self.status: tuple[float, str] | None = None  # rank 0's last run_end
        self.world_size: tuple[float, int] | None = None  # rank 0's last run_start
        self.step_hist = Histogram(step_buckets)
        self.saves: dict[tuple[int, int, int], dict[str, Any]] = {}
        self.commits = 0
        self.last_commit: tuple[float, int] | None = None
        self.failed = 0
        self.skipped = 0
        self.restore_skipped: dict[str, int] = {}  # source -> copies failing their check at a restore
        self.detections: list[tuple[float, int, str]] = []  # every rank's: (t, tier, reason)
        self.detections_rank0: dict[str, int] = {}
        self.faults: list[dict[str, Any]] = []  # every fault_injected, compact
        self.restores_all: list[tuple[float, int, str | None]] = []
        self.stragglers: list[dict[str, Any]] = []  # every `straggler` finding (rare: one per window)
        self.guard_rollbacks = 0  # rank 0's guard_rollback events: each skipped one batch
        self.suspect_nodes: set[int] = set()  # nodes rank 0 reported suspect (node_suspect)
        self._reset_steps()

    def _reset_steps(self) -> None:
        self.steps_executed = 0
        self.retained: deque[Step] = deque()
        self.kept: dict[int, Step] = {}  # step number -> its last execution, for retained executions
        self.folded = IntervalSet()  # step numbers whose last execution left the window
        # Executions that left the window but a rollback will redo: step -> (duration, tokens).
        self.pending: dict[int, tuple[float, int]] = {}
        self.folded_by_segment: dict[int, IntervalSet] = {}
        self.last_folded: Step | None = None
        self.kept_productive = 0.0
        self.kept_tokens = 0
        self.kept_count = 0
        self.restores0: list[tuple[float, int, str | None]] = []
        self.frozen: list[dict[str, Any]] = []  # reports of the first len(frozen) faults, final
        self.frozen_until = -math.inf  # faults before this time are frozen
        self.cutoff = -math.inf  # steps ending before it were folded out of the window
        self._all_steps = 0

    # -- folding ---------------------------------------------------------------------------------------
    def add(self, e: dict[str, Any]) -> None:
        self.work.lines_parsed += 1
        t = float(e["t"])
        self.first_t = t if self.first_t is None else min(self.first_t, t)
        self.last_t = t if self.last_t is None else max(self.last_t, t)
        ev, rank0 = e["ev"], int(e["rank"]) == 0
        if (
            ev in ("fault_injected", "fault_detected", "restore")
            and t < self.cutoff
            and not (ev == "restore" and rank0)
        ):
            self._rebuild_needed = True
        if ev == "step":
            if rank0:
                self.step_hist.observe(float(e["t_end"]) - float(e["t_start"]))
                self._add_step(e)
        elif ev == "restore":
            entry = (t, int(e["step"]), e.get("source"))
            self.restores_all.append(entry)
            if rank0:
                self.restores0.append(entry)
                top = self.folded.max()
                if top is not None and top > entry[1]:  # redone steps whose results left the window
                    self._rebuild_needed = True
        elif ev == "fault_injected":
            self.faults.append({"t": t, "fault": e["fault"], "step": e["step"], "rank": int(e["rank"])})
        elif ev == "fault_detected":
            self.detections.append((t, int(e["tier"]), str(e.get("reason"))))
            if rank0:
                tier = str(e["tier"])
                self.detections_rank0[tier] = self.detections_rank0.get(tier, 0) + 1
        elif ev == "ckpt_save":
            save = (int(e["step"]), int(e["restart"]), int(e["iteration"]))
            entry_ = self.saves.setdefault(
                save, {"step": save[0], "blocked_s": 0.0, "bytes": 0, "mode": e["mode"], "ranks": 0}
            )
            entry_["blocked_s"] = max(entry_["blocked_s"], float(e["blocked_s"]))
            entry_["bytes"] += int(e["bytes"])
            entry_["ranks"] += 1
        elif rank0 and ev == "ckpt_commit":
            self.commits += 1
            if self.last_commit is None or t >= self.last_commit[0]:
                self.last_commit = (t, int(e["step"]))
        elif rank0 and ev == "ckpt_failed":
            self.failed += 1
        elif ev == "ckpt_skipped":
            self.skipped += 1
        elif ev == "restore_skipped":
            source = str(e["source"])
            self.restore_skipped[source] = self.restore_skipped.get(source, 0) + 1
        elif ev == "straggler":
            from trainer.events.metrics import straggler_line

            self.stragglers.append(straggler_line(e))
        elif rank0 and ev == "run_start":
            if self.world_size is None or t >= self.world_size[0]:
                self.world_size = (t, int(e["world_size"]))
        elif rank0 and ev == "guard_rollback":
            self.guard_rollbacks += 1
        elif rank0 and ev == "node_suspect":
            self.suspect_nodes.add(int(e["node"]))
        elif rank0 and ev == "run_end" and (self.status is None or t >= self.status[0]):
            self.status = (t, str(e["status"]))

    _rebuild_needed = False

    def _add_step(self, e: dict[str, Any]) -> None:
        s = Step(
            int(e["step"]), float(e["t_start"]), float(e["t_end"]), float(e["loss"]), int(e["tokens"]),
            int(e["pid"]), int(e["iteration"]), len(self.restores0), straggler_wait(e),
        )  # fmt: skip
        self.steps_executed += 1
        old = self.kept.get(s.step)
        if old is not None:
            self.kept_productive -= old.productive
            self.kept_tokens -= old.tokens
            self.kept_count -= 1
        elif s.step in self.pending:
            duration, tokens = self.pending.pop(s.step)
            self.kept_productive -= duration
            self.kept_tokens -= tokens
            self.kept_count -= 1
        elif s.step in self.folded:
            self._rebuild_needed = True  # its earlier execution left the window: re-read rank 0's file
        self.kept[s.step] = s
        self.kept_productive += s.productive
        self.kept_tokens += s.tokens
        self.kept_count += 1
        self.retained.append(s)

    def settle(self) -> None:
        """After a batch of adds: rebuild if needed, then fold steps older than the window out of it."""
        if self._rebuild_needed and self.reread_rank0 is not None:
            self._rebuild()
        self._rebuild_needed = False
        if not self.retained:
            return
        cutoff = self.retained[-1].t_end - self.retain_s
        if self.retained[0].t_end >= cutoff:
            return
        self._freeze_faults_before(cutoff)
        segment = len(self.restores0)
        resumed = self.restores0[-1][1] if self.restores0 else -1
        while self.retained and self.retained[0].t_end < cutoff:
            s = self.retained.popleft()
            if self.kept.get(s.step) is s:
                del self.kept[s.step]
                if s.segment < segment and s.step > resumed:  # rolled back over: it will be redone
                    self.pending[s.step] = (s.productive, s.tokens)
                else:  # its result stands: only a later rollback redoes it (then a rebuild)
                    self.folded.add(s.step)
            # every execution, kept or redone later: a fault's "steps done since the last restore"
            self.folded_by_segment.setdefault(s.segment, IntervalSet()).add(s.step)
            self.last_folded = s
        self.cutoff = cutoff

    def _rebuild(self) -> None:
        assert self.reread_rank0 is not None
        self.work.rebuilds += 1
        self._reset_steps()
        keep = self.retain_s
        self.retain_s = math.inf  # while re-reading, keep every step: nothing is folded half-way
        for e in self.reread_rank0():
            self.work.lines_parsed += 1
            if e["ev"] == "step":
                self._add_step(e)
            elif e["ev"] == "restore":
                self.restores0.append((float(e["t"]), int(e["step"]), e.get("source")))
        self.retain_s = keep
        self._rebuild_needed = False

    def _freeze_faults_before(self, cutoff: float) -> None:
        merged = self._merged_faults()
        n = sum(1 for f in merged if f["t"] < cutoff)
        if n > len(self.frozen):  # the steps around these faults are about to leave the window
            self.frozen += self._reports(merged[:n], start=len(self.frozen))
            self.frozen_until = merged[n - 1]["t"]

    # -- figures ---------------------------------------------------------------------------------------
    def restores(self) -> list[tuple[float, int, str | None]]:
        return self.restores0 or sorted(self.restores_all)

    def _merged_faults(self) -> list[dict[str, Any]]:
        merged: list[dict[str, Any]] = []
        for f in sorted(self.faults, key=lambda f: f["t"]):
            last = merged[-1] if merged else None
            if (
                last is not None
                and f["fault"] == "node-loss"
                and (last["fault"], last["step"]) == (f["fault"], f["step"])
                and not any(last["t"] < s.t_end <= f["t"] for s in self.retained)
            ):
                continue
            merged.append(f)
        return merged

    def fault_reports(self) -> list[dict[str, Any]]:
        """Per fault, what summarize() gives: type, tier, detection_s, mttr_s, steps_recomputed, recovered."""
        merged = self._merged_faults()
        n = len(self.frozen)
        return self.frozen + self._reports(merged, start=n)

    def _reports(self, merged: list[dict[str, Any]], start: int = 0) -> list[dict[str, Any]]:
        restores = self.restores()
        detections = sorted(self.detections)
        out = []
        for i in range(start, len(merged)):
            next_t = merged[i + 1]["t"] if i + 1 < len(merged) else math.inf
            out.append(self._report(merged[i], next_t, restores, detections))
        return out

    def _report(
        self,
        fault: dict[str, Any],
        next_fault_t: float,
        restores: list[tuple[float, int, str | None]],
        detections: list[tuple[float, int, str]],
    ) -> dict[str, Any]:
        t_fault = fault["t"]
        self.work.records_visited += len(self.retained)
        after = [s for s in self.retained if s.t_start >= t_fault]
        if fault["fault"] in NOT_A_STOP:
            return self._slow_report(fault, after, next_fault_t, restores)
        before_last = next((s for s in reversed(self.retained) if s.t_end <= t_fault), None)
        if before_last is None and self.last_folded is not None and self.last_folded.t_end <= t_fault:
            before_last = self.last_folded
        restore_after = next((r for r in restores if r[0] > t_fault), None)
        restore_before = [r for r in restores if r[0] <= t_fault]
        since = restore_before[-1][0] if restore_before else -math.inf
        done_retained = {s.step for s in self.retained if since < s.t_end <= t_fault}
        # Folded steps ended before the window, so before the fault: those after `since` are the ones of
        # the segments that began with rank 0's restores from `since` on.
        first_segment = sum(1 for r in self.restores0 if r[0] <= since) if self.restores0 else 0
        folded_sets = [v for k, v in self.folded_by_segment.items() if k >= first_segment]

        until = min(after[0].t_start if after else math.inf, next_fault_t)
        seen = [d for d in detections if t_fault <= d[0] <= until]
        tier = max((d[1] for d in seen), default=None)
        if after and before_last is not None and after[0].pid != before_last.pid:
            tier = 2
        elif (
            tier is None and after and before_last is not None and after[0].iteration > before_last.iteration
        ):
            tier = 1
        recomputed = None
        if restore_after is not None:
            r = restore_after[1]
            # Disjoint: an unfrozen fault is inside the window, so the folded steps before it are those of
            # the one segment `since` began, each step number once, and the retained ones are the rest.
            recomputed = sum(1 for s in done_retained if s > r) + sum(fs.count_above(r) for fs in folded_sets)
        highs = [max(done_retained, default=-1)] + [fs.max() or -1 for fs in folded_sets]
        high = max(highs)
        progress = next((s for s in after if s.step > high), None)
        return {
            "type": fault["fault"],
            "step": fault["step"],
            "rank": fault["rank"],
            "t": t_fault,
            "tier": tier,
            "detection_s": seen[0][0] - t_fault if seen else None,
            "restored_step": restore_after[1] if restore_after is not None else None,
            "mttr_s": after[0].t_start - t_fault if after else None,
            "steps_recomputed": recomputed,
            "time_to_new_progress_s": progress.t_start - t_fault if progress is not None else None,
            "recovered": bool(after),
        }

    def _slow_report(
        self,
        fault: dict[str, Any],
        after: list[Step],
        next_fault_t: float,
        restores: list[tuple[float, int, str | None]],
    ) -> dict[str, Any]:
        """As trainer.events.metrics reports a `slow` fault: found by the straggler watch, nothing stopped;
        the restore of its node's eviction, if one followed (its recomputed steps from the retained hour)."""
        t_fault = fault["t"]
        found = next((f for f in self.stragglers if f["t"] >= t_fault and fault["rank"] in f["ranks"]), None)
        restore = next((r for r in restores if t_fault < r[0] < next_fault_t), None)
        recomputed = 0
        if restore is not None:
            since = max((r[0] for r in restores if r[0] <= t_fault), default=-math.inf)
            done = {s.step for s in self.retained if since < s.t_end <= restore[0]}
            recomputed = sum(1 for step in done if step > restore[1])
        return {
            "type": fault["fault"], "step": fault["step"], "rank": fault["rank"], "t": t_fault,
            "tier": None, "detection_s": found["t"] - t_fault if found is not None else None,
            "restored_step": restore[1] if restore is not None else None, "mttr_s": None,
            "steps_recomputed": recomputed, "time_to_new_progress_s": None, "recovered": bool(after),
        }  # fmt: skip

    def last_step(self) -> Step | None:
        return self.retained[-1] if self.retained else self.last_folded

    def completed(self) -> bool:
        return self.status is not None and self.status[1] == "completed"

    def window_busy(self, since: float, until: float) -> float:
        """Time in [since, until] spent in kept steps (their last execution). The window must lie within
        the retained hour: older steps were folded."""
        self.work.records_visited += len(self.retained)
        last: dict[int, Step] = {}
        for s in self.retained:
            if s.t_end > since:
                last[s.step] = s
        return math.fsum(max(0.0, min(s.t_end, until) - max(s.t_start, since)) for s in last.values())

    def per_save(self) -> list[dict[str, Any]]:
        return sorted(self.saves.values(), key=lambda s: (s["step"], s["ranks"]))

    def held(self) -> int:
        """Records held: what grows with the run (for the memory bound the tests check)."""
        return (
            len(self.retained) + len(self.kept) + 2 * len(self.folded) + len(self.pending)
            + sum(2 * len(v) for v in self.folded_by_segment.values())
            + len(self.saves) + len(self.detections) + len(self.faults) + len(self.restores_all)
            + len(self.restores0) + len(self.frozen)
        )  # fmt: skip
