"""The recovery benchmark's measurements: one run's figures from its events and the launcher's log, and
their median, min and max per scenario (bench.recovery runs the scenarios; its docstring defines the
figures)."""

from __future__ import annotations

import datetime as dt
import json
import re
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from bench.stats import spread


class MeasuredScenario(Protocol):
    """What the figures need of a scenario (bench.recovery.Scenario has it): its name, and whether the
    whole pod is started again after the launcher gives up (then the pod's exit is the detection)."""

    @property
    def name(self) -> str: ...

    @property
    def job_restarts(self) -> int: ...


def measure(
    out_dir: Path, sc: MeasuredScenario, t_launch: float, exits: Sequence[dict[str, float]], rc: int | None
) -> dict[str, Any]:
    """Recovery figures of one run from its event files (and the pod exits, for a full restart)."""
    from trainer.events.metrics import read_events, summarize

    summary = summarize(out_dir)
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2, default=str))
    events, _ = read_events(out_dir)
    rec: dict[str, Any] = {
        "scenario": sc.name,
        "rc": rc,
        "pod_exits": [int(e["rc"]) for e in exits],
        "status": summary.get("status"),
        "wall_s": summary.get("wall_s"),
        "efficiency": summary.get("training_efficiency"),
        "launch_to_first_step_s": None,
    }
    # Every recovery starts rank 0 afresh (a new process or Wrapper iteration); one start plus one per
    # injected fault is expected, any more is a restart nobody injected (e.g. a collective timeout).
    starts0 = sum(1 for e in events if e["ev"] == "run_start" and int(e["rank"]) == 0)
    rec["unplanned_restarts"] = max(0, starts0 - 2)
    steps0 = [e for e in events if e["ev"] == "step" and int(e["rank"]) == 0]
    if steps0:
        rec["launch_to_first_step_s"] = float(steps0[0]["t_start"]) - t_launch
    faults = [e for e in events if e["ev"] == "fault_injected"]
    rec["ok"] = bool(rc == 0 and summary.get("status") == "completed" and len(faults) == 1)
    if not faults:
        rec["error"] = "no fault_injected event"
        return rec
    fault = faults[0]
    tf = float(fault["t"])
    report = (summary.get("faults") or [{}])[0]
    rec.update(
        tier=report.get("tier"),
        mttr_s=report.get("mttr_s"),
        steps_recomputed=report.get("steps_recomputed"),
        recovered=report.get("recovered"),
    )
    after = [e for e in events if float(e["t"]) > tf]
    detected = next((e for e in after if e["ev"] == "fault_detected"), None)
    if sc.job_restarts and len(exits) > 1:
        # Nobody survives to report it: the job "knows" when its pod has failed.
        t_detect: float | None = float(exits[0]["t"])
        rec["detected_by"] = f"pod exit {exits[0]['rc']}"
    else:
        # The launcher notices a dead or failed worker before any survivor is told (and a worker that
        # raised on its own writes no fault_detected), so take whichever came first.
        seen = [(float(detected["t"]), f"tier {detected['tier']}: {detected['reason']}")] if detected else []
        seen += [(t, f"ft_launcher: {text}") for t, text in launcher_failures(out_dir.parent) if t > tf]
        t_detect, rec["detected_by"] = min(seen) if seen else (None, None)
    start = next((e for e in after if e["ev"] == "run_start" and int(e["rank"]) == 0), None)
    restore = next((e for e in after if e["ev"] == "restore" and int(e["rank"]) == 0), None)
    first = next((e for e in after if e["ev"] == "step" and int(e["rank"]) == 0), None)
    rec["detection_s"] = None if t_detect is None else t_detect - tf
    rec["resume_s"] = None if first is None else float(first["t_start"]) - tf
    redo = next(
        (
            e
            for e in after
            if e["ev"] == "step" and int(e["rank"]) == 0 and int(e["step"]) == int(fault["step"])
        ),
        None,
    )
    rec["regain_s"] = None if redo is None else float(redo["t_start"]) - tf
    rec["load_s"] = None if restore is None else float(restore["load_s"])
    if None not in (t_detect, start, restore, first):
        assert t_detect is not None and start is not None and restore is not None and first is not None
        t_start, t_rest = float(start["t"]), float(restore["t"])
        load = float(restore["load_s"])
        rec["phases"] = {
            "detect": t_detect - tf,
            "restart": t_start - t_detect,
            "init": (t_rest - load) - t_start,
            "load": load,
            "first_step": float(first["t_start"]) - t_rest,
        }
    return rec


LAUNCHER_FAILURE = re.compile(
    r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\] \[\w+\] \[ft_launcher[^\]]*\] "
    r".*(failed \(exitcode|UNHEALTHY|[Hh]eartbeat|hung)"
)


def launcher_failures(run_dir: Path) -> list[tuple[float, str]]:
    """(unix time, message) of each worker failure ft_launcher logged (it stamps local time, ms)."""
    found = []
    for log in sorted(run_dir.glob("pod*.log")):
        for line in log.read_text(errors="replace").splitlines():
            m = LAUNCHER_FAILURE.match(line)
            if m:
                t = dt.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
                found.append((t, line[m.end(1) + 1 :].split("] ", 2)[-1][:160]))
    return found


def aggregate(records: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Median, min and max of each figure per scenario, over the successful repetitions."""
    out: dict[str, dict[str, Any]] = {}
    for name in dict.fromkeys(r["scenario"] for r in records):
        runs = [r for r in records if r["scenario"] == name]
        good = [r for r in runs if r.get("ok")]
        entry: dict[str, Any] = {
            "runs": len(runs),
            "ok": len(good),
            "unplanned_restarts": sum(int(r.get("unplanned_restarts") or 0) for r in runs),
        }
        keys = ("detection_s", "mttr_s", "resume_s", "regain_s", "load_s", "steps_recomputed")
        for key in (*keys, "launch_to_first_step_s"):
            entry[key] = spread([r[key] for r in good if r.get(key) is not None])
        phases = [r["phases"] for r in good if r.get("phases")]
        if phases:
            entry["phases"] = {k: statistics.median(p[k] for p in phases) for k in phases[0]}
        out[name] = entry
    return out
