"""Live Prometheus figures of a run, computed from the same event log as summary.json.

Every scrape reads what the ranks appended to `<out-dir>/events.rank*.jsonl` since the last scrape (an
offset per file, complete lines only), folds it into running aggregates (trainer/events/metrics_fold.py: the
figures of `trainer.events.metrics.summarize`, memory bounded by the ranks and the last hour of steps) and
turns them into metric families. So a scrape costs what was appended, the live numbers are the summary's,
counters survive worker restarts (they are counted from the log, not in a process that a tier-2 restart
replaces), and a run that completed exports exactly what summary.json holds. docs/metrics.md lists every
metric; the chart and the collectors (docs/infra.md) scrape it.

trainer/events/metrics_server.py serves it over HTTP from a child process of local rank 0 of every pod (one
endpoint per pod, so every pod the collector discovers answers, and `up` is per node). Only the process
that is global rank 0 exports the run's figures (one series per run, whichever pod hosts rank 0 after a
restart); the others export only `trainer_exporter_info`. A port that is taken (several local pods on one
host) logs a warning and training goes on without the endpoint: metrics are never worth a failed step.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from trainer.events.metrics import events_path, parse_event_line
from trainer.events.metrics_fold import Histogram, RunFold

# Bucket upper bounds, seconds. Recovery spans tier 1 on CPU (~0.3 s) to a tier-2 restart of a 70B job
# that waits for a replacement node (tens of minutes); checkpoint stalls span async saves (ms) to sync ones.
RECOVERY_BUCKETS = (0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1200, 3600)
DETECTION_BUCKETS = (0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600)
STALL_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 300)
GOODPUT_WINDOW_S = 3600.0  # "goodput over the last hour": the window of the alarm's figure
STEP_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60)


class EventTail:
    """The run's events folded incrementally: each poll reads only the complete lines appended since the
    last one (an offset per file) and folds them into a RunFold; no event is kept after it was folded."""

    def __init__(self, out_dir: str | Path) -> None:
        self.out_dir = Path(out_dir)
        self._offsets: dict[str, int] = {}  # file name -> bytes folded (complete lines)
        self.fold = RunFold(STEP_BUCKETS, reread_rank0=self._reread_rank0)

    @property
    def bad(self) -> int:
        return self.fold.bad

    def _grown(self) -> list[tuple[str, int, int]]:
        """(file name, offset, size) of the event files that grew since the last poll, by name.

        One scandir and one stat per file, and no open for a file that did not grow: with 16,384 ranks,
        most files see a line per restart or save, not per scrape (Contract 3)."""
        grown = []
        try:
            entries = list(os.scandir(self.out_dir))
        except FileNotFoundError:
            return []
        for entry in entries:
            name = entry.name
            if not (name.startswith("events.rank") and name.endswith(".jsonl")):
                continue
            try:
                size = entry.stat().st_size
            except FileNotFoundError:
                continue
            offset = self._offsets.get(name, 0)
            if size > offset:
                grown.append((name, offset, size))
        return sorted(grown)

    def poll(self) -> None:
        for name, offset, _size in self._grown():
            try:
                with open(self.out_dir / name, "rb") as fh:
                    fh.seek(offset)
                    data = fh.read()
            except FileNotFoundError:
                continue
            end = data.rfind(b"\n") + 1  # a line still being written is read on a later poll
            if end == 0:
                continue
            self._offsets[name] = offset + end
            for record in _records(data[:end], self.fold):
                self.fold.add(record)
        self.fold.settle()

    def _reread_rank0(self) -> Iterator[dict[str, Any]]:
        """Rank 0's events from its file's start up to what was folded (a rebuild; rare)."""
        path = events_path(self.out_dir, 0)
        with open(path, "rb") as fh:
            data = fh.read(self._offsets.get(path.name, 0))
        yield from _records(data, None)


def _records(data: bytes, fold: RunFold | None) -> Iterator[dict[str, Any]]:
    for raw in data.splitlines():
        line = raw.decode("utf-8", errors="replace").strip()
        if not line:
            continue
        record = parse_event_line(line)
        if record is not None:
            yield record
        elif fold is not None:
            fold.work.lines_parsed += 1
            fold.bad += 1


def fold_events(events: Iterable[dict[str, Any]], bad: int = 0) -> RunFold:
    """A RunFold of events already read (e.g. by trainer.events.metrics.read_events)."""
    fold = RunFold(STEP_BUCKETS, retain_s=math.inf)
    for e in events:
        fold.add(e)
    fold.bad = bad
    fold.settle()
    return fold


def live_goodput(summary: dict[str, Any], first_t: float | None, now: float) -> float | None:
    """Productive time over wall time since the run's first event: `now` while the run goes on, the last
    event once rank 0 completed (then it equals summary.json's training_efficiency)."""
    if summary["status"] == "completed":
        return summary["training_efficiency"]
    if first_t is None or now <= first_t:
        return None
    return summary["productive_s"] / (now - first_t)


def _histogram(
    name: str,
    doc: str,
    labels: Sequence[str],
    groups: dict[tuple[str, ...], list[float]],
    bounds: Sequence[float],
) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, doc, labels=list(labels))
    for key, values in sorted(groups.items()):
        buckets = [(_le(b), float(sum(1 for v in values if v <= b))) for b in bounds]
        buckets.append(("+Inf", float(len(values))))
        family.add_metric(list(key), buckets, math.fsum(values))
    return family


def _folded_histogram(name: str, doc: str, hist: Histogram) -> HistogramMetricFamily:
    family = HistogramMetricFamily(name, doc, labels=[])
    counts = hist.counts or [0] * len(hist.bounds)
    buckets = [(_le(b), float(c)) for b, c in zip(hist.bounds, counts, strict=True)]
    buckets.append(("+Inf", float(hist.n)))
    family.add_metric([], buckets, hist.total)
    return family


def _le(bound: float) -> str:
    return repr(float(bound))


def _gauge(name: str, doc: str, value: float | None) -> Iterator[Metric]:
    if value is not None:
        yield GaugeMetricFamily(name, doc, value=float(value))


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=float(value))


def fold_families(fold: RunFold, now: float) -> Iterator[Metric]:
    """The run's metric families (docs/metrics.md) from its folded events, as of `now`."""
    first_t = fold.first_t
    completed = fold.completed()
    wall_done = (fold.last_t - first_t) if first_t is not None and fold.last_t is not None else 0.0
    productive = fold.kept_productive
    if completed:
        goodput = productive / wall_done if wall_done > 0 else None
    else:
        goodput = live_goodput(
            {"status": "running", "productive_s": productive, "training_efficiency": None}, first_t, now
        )
    yield from _gauge(
        "trainer_goodput_ratio",
        "Productive time (steps kept, not recomputed) over wall time since the run's first event",
        goodput,
    )
    yield GaugeMetricFamily(
        "trainer_productive_seconds",
        "Summed duration of the steps whose results were kept, less their wait for a straggling node",
        value=productive,
    )
    wall = wall_done if completed or first_t is None else now - first_t
    yield GaugeMetricFamily("trainer_wall_seconds", "Wall time since the run's first event", value=wall)
    yield from _gauge("trainer_run_start_timestamp_seconds", "Unix time of the run's first event", first_t)
    yield GaugeMetricFamily(
        "trainer_run_completed", "1 once rank 0 reported the run completed", value=float(completed)
    )
    if fold.world_size is not None:
        yield GaugeMetricFamily("trainer_world_size", "Ranks in the job", value=float(fold.world_size[1]))
    yield _counter(
        "trainer_steps_total", "Steps executed by the job, recomputed ones included", fold.steps_executed
    )
    yield _counter(
        "trainer_steps_recomputed_total",
        "Steps executed again because the run resumed from an older checkpoint",
        fold.steps_executed - fold.kept_count,
    )
    yield _counter("trainer_tokens_total", "Tokens of the steps whose results were kept", fold.kept_tokens)
    last = fold.last_step()
    if last is not None:
        yield GaugeMetricFamily(
            "trainer_last_step", "Number of the last step executed", value=float(last.step)
        )
        yield GaugeMetricFamily("trainer_loss", "Mean loss over ranks of the last step", value=last.loss)
    since_step = last.t_end if last is not None else first_t
    if not completed and since_step is not None:
        yield GaugeMetricFamily(
            "trainer_seconds_since_last_step",
            "Seconds since the last step ended (since the run started before the first step)",
            value=now - since_step,
        )
    if not completed and first_t is not None and now - first_t >= GOODPUT_WINDOW_S:
        since = now - GOODPUT_WINDOW_S
        yield GaugeMetricFamily(
            "trainer_goodput_last_hour_ratio",
            "Productive time of the last hour over an hour (exported once the run is an hour old)",
            value=fold.window_busy(since, now) / GOODPUT_WINDOW_S,
        )
    yield _folded_histogram("trainer_step_duration_seconds", "Duration of each executed step", fold.step_hist)
    yield from _fault_families(fold)
    yield from _checkpoint_families(fold, first_t, now)
    yield GaugeMetricFamily(
        "trainer_event_log_unreadable_lines",
        "Event log lines that could not be parsed (torn by a killed process)",
        value=float(fold.bad),
    )


def _fault_families(fold: RunFold) -> Iterator[Metric]:
    # A fault's tier is known only once training resumed (a tier-1 detection may still turn into a tier-2
    # restart): series labelled by tier appear then, so no counter ever moves between label sets.
    faults = CounterMetricFamily("trainer_faults_total", "Injected faults by kind", labels=["kind"])
    recovered = CounterMetricFamily(
        "trainer_faults_recovered_total",
        "Injected faults after which training resumed, by the tier that recovered them and kind",
        labels=["tier", "kind"],
    )
    counts: dict[str, int] = {}
    recovery: dict[tuple[str, ...], list[float]] = {}
    detection: dict[tuple[str, ...], list[float]] = {}
    for f in fold.fault_reports():
        counts[str(f["type"])] = counts.get(str(f["type"]), 0) + 1
        if not f["recovered"] or f["mttr_s"] is None:
            continue
        key = (str(f["tier"]), str(f["type"]))
        recovery.setdefault(key, []).append(float(f["mttr_s"]))
        if f["detection_s"] is not None:
            detection.setdefault(key, []).append(float(f["detection_s"]))
    for kind, n in sorted(counts.items()):
        faults.add_metric([kind], float(n))
    for labels, values in sorted(recovery.items()):
        recovered.add_metric(list(labels), float(len(values)))
    yield faults
    yield recovered
    yield _histogram(
        "trainer_recovery_seconds",
        "Fault to the start of the first step after it (training resumed), per injected fault",
        ("tier", "kind"),
        recovery,
        RECOVERY_BUCKETS,
    )
    yield _histogram(
        "trainer_fault_detection_seconds",
        "Fault to its first detection by any rank, per recovered injected fault",
        ("tier", "kind"),
        detection,
        DETECTION_BUCKETS,
    )
    # Real faults are not injected: rank 0's detections (one per in-process or worker-group restart it
    # took part in) count them by tier.
    detections = CounterMetricFamily(
        "trainer_fault_detections_total",
        "Faults detected by rank 0, by the tier that handled them",
        labels=["tier"],
    )
    for tier, n in sorted(fold.detections_rank0.items()):
        detections.add_metric([tier], float(n))
    yield detections
    stragglers = CounterMetricFamily(
        "trainer_stragglers_total",
        "Nodes found slower than their peers for a window, by what the straggler policy did (evict, report)",
        labels=["action"],
    )
    actions: dict[str, int] = {}
    for found in fold.stragglers:
        actions[found["action"]] = actions.get(found["action"], 0) + 1
    for action, n in sorted(actions.items()):
        stragglers.add_metric([action], float(n))
    yield stragglers
    yield from _gauge(
        "trainer_straggler_score",
        "The last straggler's score: its step time over its peers' median (absent until one is found)",
        fold.stragglers[-1]["score"] if fold.stragglers else None,
    )
    yield _counter(
        "trainer_restores_total",
        "Checkpoint restores by rank 0 (one per start, recovery or not; a fresh start restores nothing)",
        sum(1 for r in fold.restores() if r[1] >= 0),
    )


def _checkpoint_families(fold: RunFold, first_t: float | None, now: float) -> Iterator[Metric]:
    completed = fold.completed()
    yield _histogram(
        "trainer_checkpoint_stall_seconds",
        "Time the training loop was blocked by each save (the slowest rank's)",
        (),
        {(): [float(s["blocked_s"]) for s in fold.per_save()]},
        STALL_BUCKETS,
    )
    yield _counter("trainer_checkpoint_saves_total", "Checkpoint saves started", len(fold.saves))
    yield _counter(
        "trainer_checkpoint_commits_total", "Checkpoints committed (durable and visible)", fold.commits
    )
    yield _counter(
        "trainer_checkpoints_skipped_total",
        "Checkpoints passed over at resume (incomplete or corrupt)",
        fold.skipped,
    )
    copies = CounterMetricFamily(
        "trainer_restore_copies_skipped_total",
        "Copies of a rank's state that failed their digest check at a restore and were passed over",
        labels=["source"],
    )
    for source, n in sorted(fold.restore_skipped.items()):
        copies.add_metric([source], float(n))
    yield copies
    yield _counter(
        "trainer_checkpoint_failures_total",
        "Checkpoint saves that failed (nothing committed, training went on)",
        fold.failed,
    )
    yield _counter(
        "trainer_guard_rollbacks_total",
        "Steps the numerical guard rolled back, each skipping its batch",
        fold.guard_rollbacks,
    )
    yield _counter(
        "trainer_suspect_nodes_total",
        "Nodes reported suspect (repeated corruption on one of their ranks, or a straggler)",
        len(fold.suspect_nodes),
    )
    if fold.last_commit is not None:
        yield GaugeMetricFamily(
            "trainer_last_checkpoint_timestamp_seconds",
            "Unix time of the last commit",
            value=fold.last_commit[0],
        )
        yield GaugeMetricFamily(
            "trainer_last_checkpoint_step",
            "Last step held by the last commit",
            value=float(fold.last_commit[1]),
        )
    since = fold.last_commit[0] if fold.last_commit is not None else first_t
    if since is not None and not completed:
        yield GaugeMetricFamily(
            "trainer_seconds_since_last_checkpoint",
            "Seconds since the last durable checkpoint (since the run started before the first one)",
            value=now - since,
        )


class RunCollector(Collector):
    """A prometheus_client collector: every collect() folds what was appended to the event files since the
    last one and exports the folded figures."""

    def __init__(
        self,
        out_dir: str | Path,
        *,
        rank: int,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.tail = EventTail(out_dir)
        self.rank = rank
        self.clock = clock
        self._lock = threading.Lock()  # scrapes may overlap (the HTTP server is threaded)

    def collect(self) -> Iterator[Metric]:
        info = GaugeMetricFamily("trainer_exporter_info", "This endpoint's process", labels=["rank"])
        info.add_metric([str(self.rank)], 1.0)
        yield info
        if self.rank != 0:
            return
        with self._lock:
            self.tail.poll()
            families = list(fold_families(self.tail.fold, self.clock()))
        yield from families
