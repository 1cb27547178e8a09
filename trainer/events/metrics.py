"""The run's event log (Contract 3 of docs/design.md) and its summary.

Every rank appends JSON lines to `<out-dir>/events.rank<R>.jsonl`. The file is opened in append mode and
line-buffered: each event is one write(2) of one full line, so it survives a SIGKILL of the process a
moment later (the kernel has it), and restarted processes keep appending to the same file. No fsync:
losing the tail of the log on a kernel crash is acceptable, stalling every step on the disk is not.

`summarize()` reads those files back and derives the goodput figures; it is a pure function of the files,
so the demo, the benchmarks and the tests all compute the same numbers. The live Prometheus figures
(trainer/events/metrics_export.py) are `summarize_events()` of the same events, read while the run
writes them.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

# Contract 3: the extra fields each event type must carry (common fields are added by EventLog).
EVENT_FIELDS: dict[str, tuple[str, ...]] = {
    "run_start": ("world_size", "config", "forked"),
    "step": ("step", "t_start", "t_end", "loss", "tokens"),
    "fault_injected": ("fault", "step"),
    "fault_detected": ("tier", "reason"),
    "restore": ("step", "path", "load_s"),
    "ckpt_skipped": ("path", "reason"),
    "restore_skipped": ("source", "step", "reason"),
    "ckpt_save": ("step", "blocked_s", "mode", "bytes"),
    "ckpt_commit": ("step", "path", "total_s"),
    "ckpt_failed": ("step", "reason"),
    "run_end": ("step", "status"),
    "snapshot": ("step", "blocked_s", "copy_s", "bytes"),
    "replica": ("step", "holder", "bytes", "send_s", "ok"),
    "data_position_unsaved": ("data",),
    "straggler": ("step", "node", "ranks", "score", "history", "policy", "action", "reason"),
    "guard_tripped": ("step", "reason", "loss", "grad_norm"),
    "guard_rollback": ("step", "restored_step", "ranks", "rollback_s"),
    "node_suspect": ("node", "ranks", "source", "reason", "step"),
}
COMMON_FIELDS = ("ev", "t", "rank", "pid", "restart", "iteration")


def events_path(out_dir: str | Path, rank: int) -> Path:
    """Where rank `rank` writes its events."""
    return Path(out_dir) / f"events.rank{rank}.jsonl"


def _json_default(obj: Any) -> Any:
    # Paths, numpy scalars and tensors show up in fields; write them as plain values, never fail a step.
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "item"):
        return obj.item()
    return str(obj)


# Per-step events written by one rank of each node only (Contract 3): the node's ranks copy equal shards
# in lockstep, so local rank 0's figures stand for the node, and FSx takes O(nodes) small appends per
# snapshot instead of O(ranks). A failed replica (`ok` false) is written by every rank: it is a fault.
NODE_SAMPLED = ("snapshot", "replica")


def writes_to_log(ev: str, local_rank: int, fields: dict[str, Any]) -> bool:
    """Whether a rank with this local rank writes this event to its file (Contract 3's "written by")."""
    if local_rank == 0 or ev not in NODE_SAMPLED:
        return True
    return ev == "replica" and not fields.get("ok", True)


class EventLog:
    """Appends Contract 3 events for one rank. `iteration` is updated by the loop on in-process restarts.

    `local_rank` (LOCAL_RANK of the launcher by default) decides which per-step events reach the file:
    `writes_to_log`. The record is returned either way.
    """

    def __init__(self, out_dir: str | Path, rank: int, *, local_rank: int | None = None) -> None:
        self.path = events_path(out_dir, rank)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.rank = rank
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0")) if local_rank is None else local_rank
        self.iteration = 0
        self.restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        self._lock = threading.Lock()  # the checkpoint finalizer may emit from another thread
        self._file = open(self.path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 (lives with the log)

    def emit(self, ev: str, **fields: Any) -> dict[str, Any]:
        """Write one event; returns the full record. Missing contract fields raise ValueError."""
        missing = [name for name in EVENT_FIELDS.get(ev, ()) if name not in fields]
        if missing:
            raise ValueError(f"event {ev!r}: missing field(s) {', '.join(missing)}")
        record: dict[str, Any] = {
            "ev": ev,
            "t": time.time(),
            "rank": self.rank,
            "pid": os.getpid(),
            "restart": self.restart,
            "iteration": self.iteration,
        }
        record.update(fields)
        if ev == "restore":
            from trainer.events import spans

            spans.mark("other")
            taken = spans.take()
            if taken is not None:
                record["spans"] = taken
        if ev == "step":
            record["t"] = fields["t_end"]
        if not writes_to_log(ev, self.local_rank, fields):
            return record
        line = json.dumps(record, default=_json_default)
        with self._lock:
            self._file.write(line + "\n")
        return record

    def close(self) -> None:
        with self._lock:
            if not self._file.closed:
                self._file.close()

    def __enter__(self) -> EventLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def parse_event_line(line: str) -> dict[str, Any] | None:
    """One line of an event file as a record, or None if it is unreadable (e.g. torn by a SIGKILL)."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return None
    return record if isinstance(record, dict) and "ev" in record and "t" in record else None


def read_events(out_dir: str | Path) -> tuple[list[dict[str, Any]], int]:
    """All events of all ranks, sorted by time, and the number of unreadable lines skipped.

    A process killed in the middle of a write can leave one torn line; it is skipped, not fatal.
    """
    events: list[dict[str, Any]] = []
    bad = 0
    for path in sorted(Path(out_dir).glob("events.rank*.jsonl")):
        with open(path, encoding="utf-8") as fh:
            for line in fh:
                line = line.strip()
                if not line:
                    continue
                record = parse_event_line(line)
                if record is None:
                    bad += 1
                else:
                    events.append(record)
    events.sort(key=lambda e: float(e["t"]))
    return events, bad


def _stats(values: Iterable[float]) -> dict[str, float | int | None]:
    vals = sorted(float(v) for v in values)
    if not vals:
        return {"count": 0, "median": None, "mean": None, "min": None, "max": None, "total": 0.0}
    return {
        "count": len(vals),
        "median": statistics.median(vals),
        "mean": statistics.fmean(vals),
        "min": vals[0],
        "max": vals[-1],
        "total": math.fsum(vals),
    }


def _kept_steps(steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The last execution of every step number: the ones whose results survived (the rest were redone)."""
    last: dict[int, dict[str, Any]] = {}
    for ev in steps:  # sorted by time, so later executions overwrite earlier ones
        last[int(ev["step"])] = ev
    return [last[s] for s in sorted(last)]


def _fault_identity(fault: dict[str, Any]) -> dict[str, Any]:
    """The fields of a fault's report that name it: what, at which step, on which ranks, when."""
    return {
        "type": fault["fault"],
        "step": fault["step"],
        "rank": fault["rank"],
        "ranks": fault.get("ranks", [fault["rank"]]),
        "t": float(fault["t"]),
    }


def _fault_report(
    fault: dict[str, Any],
    next_fault_t: float,
    steps: list[dict[str, Any]],
    detections: list[dict[str, Any]],
    restores: list[dict[str, Any]],
    every_restore: list[dict[str, Any]] | None = None,
    stragglers: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    t_fault = float(fault["t"])
    after = [s for s in steps if float(s["t_start"]) >= t_fault]
    before = [s for s in steps if float(s["t_end"]) <= t_fault]
    restore_after = next((r for r in restores if float(r["t"]) > t_fault), None)
    restore_before = [r for r in restores if float(r["t"]) <= t_fault]
    since = float(restore_before[-1]["t"]) if restore_before else -math.inf
    done_before = {int(s["step"]) for s in before if since < float(s["t_end"])}

    # Detections between the fault and training's resumption (or the next fault). A tier-2 fault is often
    # seen first by a survivor's tier-1 Wrapper and then handled by the launcher: the highest tier among
    # them is the one that recovered it; detection_s is the first one.
    until = min(float(after[0]["t_start"]) if after else math.inf, next_fault_t)
    seen = [d for d in detections if t_fault <= float(d["t"]) <= until]
    tier = max((int(d["tier"]) for d in seen), default=None)
    if after and before and after[0]["pid"] != before[-1]["pid"]:
        tier = 2  # rank 0 runs in a new process: the workers were restarted
    elif tier is None and after and before and int(after[0]["iteration"]) > int(before[-1]["iteration"]):
        tier = 1
    detected = seen[0] if seen else None
    if fault["fault"] in NOT_A_STOP:
        report = _slow_report(fault, after, stragglers or [])
        if restore_after is not None and float(restore_after["t"]) < next_fault_t:  # its node's eviction
            t_restore, resumed = float(restore_after["t"]), int(restore_after["step"])
            done = {int(s["step"]) for s in steps if since < float(s["t_end"]) <= t_restore}
            report["steps_recomputed"] = sum(1 for s in done if s > resumed)
            report["restored_step"] = resumed
            report["restored_from"] = restore_after.get("source")
            report["restored_by_source"] = _sources_after(every_restore or restores, t_fault, next_fault_t)
        return report

    recomputed = None
    if restore_after is not None:
        recomputed = sum(1 for s in done_before if s > int(restore_after["step"]))
    # Training resumed at the first step after the fault; it made new progress once it passed the
    # highest step done before the fault (the difference is the recomputation).
    high = max(done_before, default=-1)
    progress = next((s for s in after if int(s["step"]) > high), None)
    return {
        **_fault_identity(fault),
        "tier": tier,
        "detection_s": float(detected["t"]) - t_fault if detected is not None else None,
        "detection_reason": detected.get("reason") if detected is not None else None,
        "restored_step": int(restore_after["step"]) if restore_after is not None else None,
        "restored_from": restore_after.get("source") if restore_after is not None else None,
        "restored_by_source": _sources_after(every_restore or restores, t_fault, next_fault_t),
        "mttr_s": float(after[0]["t_start"]) - t_fault if after else None,
        "steps_recomputed": recomputed,
        "time_to_new_progress_s": float(progress["t_start"]) - t_fault if progress is not None else None,
        "recovered": bool(after),
    }


NOT_A_STOP = ("slow",)
"""Injected faults that stop nothing: a slow rank keeps training (its cost is the `straggler` loss term,
and an eviction's the `eviction` term), so it has no recovery time, no tier and no step in flight."""


def _slow_report(
    fault: dict[str, Any], after: list[dict[str, Any]], stragglers: list[dict[str, Any]]
) -> dict[str, Any]:
    """A `slow` fault's report: detected when the straggler watch first named the node of its rank (where
    an eviction restored from is added by `_fault_report`)."""
    t_fault, rank = float(fault["t"]), int(fault["rank"])
    found = next(
        (e for e in stragglers if float(e["t"]) >= t_fault and rank in [int(r) for r in e.get("ranks", [])]),
        None,
    )
    return {
        **_fault_identity(fault),
        "tier": None,
        "detection_s": float(found["t"]) - t_fault if found is not None else None,
        "detection_reason": f"straggler at step {found['step']}: {found['action']}" if found else None,
        "found_at_step": int(found["step"]) if found is not None else None,
        "restored_step": None,
        "restored_from": None,
        "restored_by_source": {},
        "mttr_s": None,
        "steps_recomputed": 0,
        "time_to_new_progress_s": None,
        "recovered": bool(after),
    }


def _sources_after(restores: list[dict[str, Any]], t_fault: float, until: float) -> dict[str, list[int]]:
    """Where each rank restored from after a fault: {source: [ranks]} (ranks of a lost node differ).

    A node loss restores the survivors from their own /dev/shm and the replaced node's ranks from a peer's
    replica, so rank 0's source alone (`restored_from`) does not say where the lost state came from.
    """
    first: dict[int, str] = {}
    for r in sorted(restores, key=lambda e: float(e["t"])):
        if t_fault < float(r["t"]) < until:
            first.setdefault(int(r["rank"]), str(r.get("source")))
    by_source: dict[str, list[int]] = {}
    for rank in sorted(first):
        by_source.setdefault(first[rank], []).append(rank)
    return by_source


def _merge_reports(injected: list[dict[str, Any]], steps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A node-loss fault fires on every rank of the node, and each reports it: consecutive node-loss reports
    of the same step with no completed step between them are one fault, timed by its first report. (Other
    kinds fire on one rank per spec: two specs at the same step stay two faults.)"""
    merged: list[dict[str, Any]] = []
    for report in injected:
        last = merged[-1] if merged else None
        if (
            last is not None
            and report["fault"] == "node-loss"
            and (last["fault"], last["step"]) == (report["fault"], report["step"])
            and not any(float(last["t"]) < float(s["t_end"]) <= float(report["t"]) for s in steps)
        ):
            last["ranks"].append(int(report["rank"]))
            continue
        merged.append({**report, "ranks": [int(report["rank"])]})
    return merged


def summarize(out_dir: str | Path) -> dict[str, Any]:
    """Merge the run's event files into goodput figures (the content of summary.json).

    - productive_s: the summed duration of the last execution of every step number (work that was kept),
      less what those steps waited for a straggling node (their `straggler_s`: the `straggler` loss term);
    - wall_s: first event to last event of any rank;
    - training_efficiency: productive_s / wall_s;
    - checkpoint stall per save: the largest blocked_s over ranks of each save (ranks wait for each other);
    - per fault: the tier that handled it, detection_s (fault -> first fault_detected), mttr_s (fault ->
      start of the first step after it: training resumed), steps_recomputed (steps done since the last
      restore and redone because the resume point was older), time_to_new_progress_s (fault -> start of
      the first step beyond the highest step done before it: mttr plus the recomputation), recovered.
    Steps are numbered as the loop numbers them; a restore's `step` must be the `step` of the last step
    event its checkpoint includes (steps after it are the ones redone).
    Step events are taken from rank 0 only, as Contract 3 has only rank 0 write them.
    """
    return summarize_events(*read_events(out_dir))


def _fault_reports(
    by_ev: dict[str, list[dict[str, Any]]], steps: list[dict[str, Any]], restores: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """One `_fault_report` per injected fault (a lost node's reports merged), in order."""
    faults = _merge_reports(by_ev.get("fault_injected", []), steps)
    out = []
    for i, fault in enumerate(faults):
        next_t = float(faults[i + 1]["t"]) if i + 1 < len(faults) else math.inf
        detections, every_restore = by_ev.get("fault_detected", []), by_ev.get("restore", [])
        stragglers = by_ev.get("straggler", [])
        out.append(_fault_report(fault, next_t, steps, detections, restores, every_restore, stragglers))
    return out


def summarize_events(events: list[dict[str, Any]], bad: int = 0) -> dict[str, Any]:
    """summarize() of events already read (sorted by time, as read_events returns them)."""
    by_ev: dict[str, list[dict[str, Any]]] = {}
    for e in events:
        by_ev.setdefault(e["ev"], []).append(e)
    steps = [e for e in by_ev.get("step", []) if int(e["rank"]) == 0]
    kept = _kept_steps(steps)

    wall_s = float(events[-1]["t"]) - float(events[0]["t"]) if events else 0.0
    durations = [float(s["t_end"]) - float(s["t_start"]) for s in kept]
    # A kept step's wait for a straggling node is lost time, not productive (trainer/resilience/straggler.py)
    productive_s = math.fsum(durations) - math.fsum(straggler_wait(s) for s in kept)

    saves: dict[tuple[int, int, int], dict[str, Any]] = {}
    for e in by_ev.get("ckpt_save", []):
        key = (int(e["step"]), int(e["restart"]), int(e["iteration"]))
        entry = saves.setdefault(
            key, {"step": key[0], "blocked_s": 0.0, "bytes": 0, "mode": e["mode"], "ranks": 0}
        )
        entry["blocked_s"] = max(entry["blocked_s"], float(e["blocked_s"]))
        entry["bytes"] += int(e["bytes"])
        entry["ranks"] += 1
    per_save = sorted(saves.values(), key=lambda s: (s["step"], s["ranks"]))
    commits = [e for e in by_ev.get("ckpt_commit", []) if int(e["rank"]) == 0]
    failed = [e for e in by_ev.get("ckpt_failed", []) if int(e["rank"]) == 0]

    restores = [e for e in by_ev.get("restore", []) if int(e["rank"]) == 0] or by_ev.get("restore", [])
    fault_reports = _fault_reports(by_ev, steps, restores)

    ends = [e for e in by_ev.get("run_end", []) if int(e["rank"]) == 0]
    evicted = evictions(by_ev.get("straggler", []), steps, restores)
    loss = loss_breakdown(events, steps, kept, fault_reports, evicted)
    return {
        "status": ends[-1]["status"] if ends else "unknown",
        "final_step": int(kept[-1]["step"]) if kept else None,
        "steps": len(kept),
        "steps_executed": len(steps),
        "steps_recomputed": len(steps) - len(kept),
        "tokens": sum(int(s["tokens"]) for s in kept),
        "wall_s": wall_s,
        "productive_s": productive_s,
        "training_efficiency": productive_s / wall_s if wall_s > 0 else None,
        "step_s": _stats(durations),
        "slow_steps": slow_steps(kept, [d - straggler_wait(s) for s, d in zip(kept, durations, strict=True)]),
        "ckpt": {
            "saves": len(per_save),
            "stall_s": _stats(s["blocked_s"] for s in per_save),
            "per_save": per_save,
            "commits": len(commits),
            "commit_total_s": _stats(float(c["total_s"]) for c in commits),
            "skipped": [{"path": e["path"], "reason": e["reason"]} for e in by_ev.get("ckpt_skipped", [])],
            "failed": len(failed),
            "failures": [{"step": e["step"], "reason": e["reason"]} for e in failed],
        },
        "snapshot": _snapshot_stats(by_ev.get("snapshot", [])),
        "restores": [
            {"step": r["step"], "path": r["path"], "load_s": r["load_s"], "source": r.get("source")}
            for r in restores
        ],
        "restore_skipped": restore_skipped(by_ev.get("restore_skipped", [])),
        "faults": fault_reports,
        "stragglers": [straggler_line(e) for e in by_ev.get("straggler", [])],
        "evictions": evicted,
        "loss_s": loss,
        "guard": guard_stats(by_ev.get("guard_rollback", []), by_ev.get("node_suspect", [])),
        "process_starts": len({(e["rank"], e["pid"]) for e in by_ev.get("run_start", [])}),
        "unreadable_lines": bad,
    }


def restore_skipped(events: Iterable[dict[str, Any]]) -> dict[str, int]:
    """Copies passed over at a restore because they failed their check, per source (every rank's)."""
    counts: dict[str, int] = {}
    for e in events:
        counts[str(e["source"])] = counts.get(str(e["source"]), 0) + 1
    return dict(sorted(counts.items()))


def straggler_line(e: dict[str, Any]) -> dict[str, Any]:
    """A `straggler` event as the summary and the live metrics keep it."""
    return {
        "step": int(e["step"]),
        "t": float(e["t"]),
        "node": int(e["node"]),
        "ranks": [int(r) for r in e.get("ranks", [])],
        "score": float(e["score"]),
        "history": float(e["history"]),
        "action": str(e["action"]),
        "reason": str(e["reason"]),
    }


def straggler_wait(step: dict[str, Any]) -> float:
    """What a step event says it waited for a straggling node (`straggler_s`, within the step's duration;
    0 in logs written before the field)."""
    duration = float(step["t_end"]) - float(step["t_start"])
    return min(max(float(step.get("straggler_s") or 0.0), 0.0), max(duration, 0.0))


def evictions(
    stragglers: list[dict[str, Any]], steps: list[dict[str, Any]], restores: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Each straggler evicted (a `straggler` event with action evict) and what its eviction cost: the
    training stopped from the last step that ended before the restore that followed it to the first step
    after that restore (`down_s`), and the steps done before it and redone after (`steps_recomputed`).
    No restore after it (the run ended first): `down_s` None."""
    out: list[dict[str, Any]] = []
    for e in stragglers:
        if e.get("action") != "evict":
            continue
        t = float(e["t"])
        restore = next((r for r in restores if float(r["t"]) >= t), None)
        entry: dict[str, Any] = {"step": int(e["step"]), "node": int(e["node"]), "t": t}
        entry.update(t_down=None, down_s=None, steps_recomputed=None, restored_step=None)
        if restore is not None:
            t_restore = float(restore["t"])
            prior = [float(r["t"]) for r in restores if float(r["t"]) < t_restore]
            since = max(prior, default=-math.inf)
            before = [s for s in steps if since < float(s["t_end"]) <= t_restore]
            resumed = next((s for s in steps if float(s["t_start"]) >= t_restore), None)
            if before and resumed is not None:
                entry["t_down"] = max(float(s["t_end"]) for s in before)
                entry["down_s"] = float(resumed["t_start"]) - entry["t_down"]
            entry["restored_step"] = int(restore["step"])
            entry["steps_recomputed"] = sum(1 for s in before if int(s["step"]) > int(restore["step"]))
        out.append(entry)
    return out


SLOW_STEP_FACTOR = 2.0
"""A kept step that took over this many times the median step is a slow one (slow_steps)."""


def slow_steps(kept: list[dict[str, Any]], durations: list[float]) -> dict[str, Any]:
    """The kept steps that took over SLOW_STEP_FACTOR x the median, and their time beyond the median.

    Productive time is the kept steps' whole duration, however slow: a step that a neighbour slowed down
    is not in the loss breakdown. This names it. With more ranks than cores (the local demo) the
    first steps after each process start run several times the median while the new processes' helpers (NVRx's
    checkpoint worker, its write-results Manager, a replacement pod's zygote) imported torch beside them,
    and the steps after a durable save 2x while its background write ran; on a GPU node the helpers have
    CPU cores of their own and a step is GPU work. `durations`: the kept steps' (summarize_events')."""
    if not durations:
        return {"median_s": None, "steps": [], "over_median_s": 0.0}
    median = statistics.median(durations)
    slow = [
        (int(s["step"]), d) for s, d in zip(kept, durations, strict=True) if d > SLOW_STEP_FACTOR * median
    ]
    return {
        "median_s": median,
        "steps": [step for step, _ in slow],
        "over_median_s": math.fsum(d - median for _, d in slow),
    }


def loss_breakdown(
    events: list[dict[str, Any]],
    steps: list[dict[str, Any]],
    kept: list[dict[str, Any]],
    faults: list[dict[str, Any]],
    evicted: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Where the wall time that is not productive went, term by term (seconds): the gap to 100 %.

    wall_s = productive_s + startup + sum(recovery) + recompute + ckpt_stall + snapshot_stall + tail
    + straggler + eviction + other, each measured from the events:
    - startup: first event -> start of the first step (rank 0);
    - recovery (one per fault that stopped training): its mttr_s, fault -> first step after it (a `slow`
      fault stops nothing: NOT_A_STOP);
    - recompute: executions of steps that were redone (not kept), and the part of the step in flight
      at each fault that ran before the fault;
    - straggler: the kept steps' wait for a straggling node (their `straggler_s`: the slowest node's
      compute beyond the other nodes' median, in the steps where it was past the straggler threshold):
      time the job ran at a straggler's pace, which productive_s leaves out;
    - eviction: each evicted straggler's `down_s` (`evictions`): its pod left, the spare took its place;
    - ckpt_stall / snapshot_stall: rank 0's blocked time per save / snapshot (the slowest rank's when
      rank 0 did not report it), of those between the first and the last step and outside recovery
      windows (the final save after the last step is the tail's). Rank 0's, not the slowest rank's: the
      terms are measured on rank 0's clock, like the productive time, and rank 0 waits for a slower
      node's snapshot inside its next step's first collective, which its step time already counts (the
      slowest node's figure would count that wait twice and leave `other` negative);
    - tail: end of the last step -> last event (the final save's commit, the run's end);
    - other: what is left: the loop's own work at step boundaries (events, heartbeats, polls).
    The planner (goodput/fit.py predict_from_summary) uses the same terms.
    """
    if not events or not kept:
        return {}
    t0, t_last = float(events[0]["t"]), float(events[-1]["t"])
    first_start = float(steps[0]["t_start"])
    last_end = max(float(s["t_end"]) for s in steps)
    windows = [
        (float(f["t"]), float(f["t"]) + float(f["mttr_s"])) for f in faults if f.get("mttr_s") is not None
    ]
    windows += [(v["t_down"], v["t_down"] + v["down_s"]) for v in evicted or [] if v["down_s"] is not None]

    def blocked(kind: str) -> float:
        """Sum over saves (or snapshots) of rank 0's blocked time (else the slowest rank's), those inside
        the run."""
        per: dict[tuple[int, int, int], tuple[float, float]] = {}
        on_rank0: dict[tuple[int, int, int], tuple[float, float]] = {}
        for e in events:
            if e["ev"] == kind:
                key = (int(e["step"]), int(e["restart"]), int(e["iteration"]))
                b, t = per.get(key, (0.0, 0.0))
                per[key] = (max(b, float(e["blocked_s"])), max(t, float(e["t"])))
                if int(e["rank"]) == 0:
                    on_rank0[key] = (float(e["blocked_s"]), float(e["t"]))
        per.update(on_rank0)
        return math.fsum(
            b
            for b, t in per.values()
            if first_start <= t - b and t <= last_end + 1e-3 and not any(a <= t - b < z for a, z in windows)
        )

    terms: dict[str, Any] = {
        "startup": first_start - t0,
        "recovery": [float(f["mttr_s"]) for f in faults if f.get("mttr_s") is not None],
        "recompute": _redone(steps, kept, faults),
        "ckpt_stall": blocked("ckpt_save"),
        "snapshot_stall": blocked("snapshot"),
        "tail": t_last - last_end,
        "straggler": math.fsum(straggler_wait(s) for s in kept),
        "eviction": math.fsum(float(v["down_s"]) for v in evicted or [] if v["down_s"] is not None),
    }
    productive = math.fsum(float(s["t_end"]) - float(s["t_start"]) for s in kept) - terms["straggler"]
    named = math.fsum([productive, *terms["recovery"], *(v for k, v in terms.items() if k != "recovery")])
    terms["other"] = (t_last - t0) - named
    return terms


def _redone(steps: list[dict[str, Any]], kept: list[dict[str, Any]], faults: list[dict[str, Any]]) -> float:
    """The recompute term: executions not kept, and the part of the step in flight at each fault that
    stopped training which ran before the fault."""
    kept_ids = {id(s) for s in kept}
    redone = math.fsum(float(s["t_end"]) - float(s["t_start"]) for s in steps if id(s) not in kept_ids)
    for f in faults:
        if f["type"] in NOT_A_STOP:
            continue
        t_fault = float(f["t"])
        ended = [float(s["t_end"]) for s in steps if float(s["t_end"]) <= t_fault]
        started = [float(s["t_start"]) for s in steps if float(s["t_start"]) <= t_fault]
        if ended and started and max(started) > max(ended):  # a step was in flight at the fault
            redone += t_fault - max(started)
    return redone


def guard_stats(rollbacks: list[dict[str, Any]], suspects: list[dict[str, Any]]) -> dict[str, Any]:
    """The numerical guard's work (rank 0's events): each rollback skipped the batch of its step. Its
    suspect nodes only: the straggler watch's are in the summary's `stragglers`."""
    rollbacks = [e for e in rollbacks if int(e["rank"]) == 0]
    mine = (e for e in suspects if int(e["rank"]) == 0 and e.get("source", "guard") == "guard")
    return {
        "rollbacks": len(rollbacks),
        "skipped_steps": [int(e["step"]) for e in rollbacks],
        "rollback_s": _stats(float(e["rollback_s"]) for e in rollbacks),
        "suspect_nodes": sorted({int(e["node"]) for e in mine}),
    }


def _snapshot_stats(events: list[dict[str, Any]]) -> dict[str, Any]:
    """Per snapshot (one step of one process incarnation) the slowest node's blocked time (each node's
    local rank 0 writes it, Contract 3); bytes per rank."""
    blocked: dict[tuple[int, int, int], float] = {}
    for e in events:
        key = (int(e["step"]), int(e["restart"]), int(e["iteration"]))
        blocked[key] = max(blocked.get(key, 0.0), float(e["blocked_s"]))
    return {
        "snapshots": len(blocked),
        "blocked_s": _stats(blocked.values()),
        "bytes_per_rank": max((int(e["bytes"]) for e in events), default=0),
    }


def write_summary(out_dir: str | Path) -> Path:
    """Write summarize(out_dir) to `<out_dir>/summary.json` (atomically) and return its path."""
    path = Path(out_dir) / "summary.json"
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(summarize(out_dir), indent=2, default=_json_default) + "\n", encoding="utf-8")
    tmp.replace(path)
    return path
