"""How busy the machine was with other work while a benchmark part ran.

The load average cannot tell a benchmark's own processes from a test suite running beside it: a
benchmark of 4 ranks on 2 cores shows a load of 5-8 by itself. What spoils a timing is CPU that *other*
processes took. `LoadMonitor` samples, every `interval_s`:

- the machine's busy CPU time (/proc/stat: user, nice, system, irq, softirq, steal), and
- the CPU time of this process and every live descendant (/proc/<pid>/stat: utime, stime and the
  cutime/cstime of the children each has reaped, so a finished child's time is still counted once),

and calls the difference *foreign* CPU: cores' worth of work that was not the benchmark. A part whose
foreign load averaged more than `QUIET_FOREIGN_CORES` is marked `quiet: false`; `python -m bench`
refuses to write such results into the committed results folder unless told to (`--allow-loaded`).
A process that escaped the tree (reparented to init: a leaked checkpoint worker) counts as foreign
from then on, which is right: it competes with the benchmark all the same. What it took while it was in
the tree stays the benchmark's (`TreeCpu`): a pod whose main process is SIGKILLed orphans its workers, and
counting their past CPU as foreign in that moment read as spikes of 6-7 cores on a quiet 2-core machine.
"""

from __future__ import annotations

import itertools
import os
import statistics
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

QUIET_FOREIGN_CORES = 0.25
"""Mean cores of other work above which a part's timings are marked as loaded (2-core machines: 1/8 of it)."""

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PROC = Path("/proc")


def machine_busy_s() -> float:
    """Busy CPU seconds of the whole machine since boot (all cores summed)."""
    fields = (_PROC / "stat").read_text().split("\n", 1)[0].split()
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[1:9])
    return (user + nice + system + irq + softirq + steal) / _TICK


def _stat(pid: int) -> tuple[int, float, int] | None:
    """(parent pid, CPU seconds incl. reaped children, start time in ticks) of a process, None when gone."""
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    rest = text[text.rindex(")") + 2 :].split()  # the command name may hold spaces and parentheses
    ppid = int(rest[1])
    utime, stime, cutime, cstime = (int(x) for x in rest[11:15])
    return ppid, (utime + stime + cutime + cstime) / _TICK, int(rest[19])


def _all_stats() -> dict[int, tuple[int, float, int]]:
    """`_stat` of every process there is."""
    stats = {}
    for entry in _PROC.iterdir():
        if entry.name.isdigit() and (got := _stat(int(entry.name))) is not None:
            stats[int(entry.name)] = got
    return stats


def _in_tree(root: int, parents: dict[int, int]) -> set[int]:
    """The pids of `root` and its live descendants."""
    members = set()
    for pid in parents:
        p, hops = pid, 0
        while p > 1 and p != root and hops < 64:
            p, hops = parents.get(p, 0), hops + 1
        if p == root:
            members.add(pid)
    return members


class TreeCpu:
    """CPU seconds of `root`'s process tree, cumulative over successive `sample()` calls.

    A process counts while it is in the tree; when it leaves without a parent in the tree to reap it
    (orphaned to init, or reaped there), what it had taken until the last sample stays counted, and
    what it takes afterwards does not. A process reaped by a parent in the tree is counted by that
    parent's cutime/cstime, as in `tree_cpu_s`.
    """

    def __init__(self, root: int) -> None:
        self.root = root
        self._seen: dict[tuple[int, int], tuple[float, int]] = {}  # (pid, start) -> (cpu, ppid) last seen
        self._kept = 0.0  # CPU of processes that left the tree

    def sample(self) -> float:
        stats = _all_stats()
        members = _in_tree(self.root, {pid: s[0] for pid, s in stats.items()})
        now = {(pid, stats[pid][2]): (stats[pid][1], stats[pid][0]) for pid in members}
        for key, (cpu, ppid) in self._seen.items():
            if key in now:
                continue
            alive = key[0] in stats and stats[key[0]][2] == key[1]
            if alive or ppid not in members:  # escaped, or gone with nobody in the tree to reap it
                self._kept += cpu
        self._seen = now
        return self._kept + sum(cpu for cpu, _ in now.values())


def tree_cpu_s(root: int) -> float:
    """CPU seconds of `root` and its live descendants, each counting the children it has reaped."""
    stats = _all_stats()
    members = _in_tree(root, {pid: s[0] for pid, s in stats.items()})
    return sum(stats[pid][1] for pid in members)


@dataclass
class LoadMonitor:
    """Samples foreign CPU and the load average in a daemon thread between `start()` and `stop()`."""

    interval_s: float = 2.0
    root: int = field(default_factory=os.getpid)
    _samples: list[dict[str, float]] = field(default_factory=list, init=False)
    _stop: threading.Event = field(default_factory=threading.Event, init=False)
    _thread: threading.Thread | None = field(default=None, init=False)
    _load_before: float = field(default=0.0, init=False)
    _tree: TreeCpu = field(init=False)

    def start(self) -> LoadMonitor:
        self._load_before = os.getloadavg()[0]
        self._tree = TreeCpu(self.root)
        self._samples.clear()
        self._stop.clear()
        self._sample()  # the baseline the first interval is measured from
        self._thread = threading.Thread(target=self._run, name="bench-load", daemon=True)
        self._thread.start()
        return self

    def _sample(self) -> None:
        self._samples.append(
            {
                "t": time.monotonic(),
                "busy": machine_busy_s(),
                "own": self._tree.sample(),
                "load": os.getloadavg()[0],
            }
        )

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def stop(self) -> dict[str, Any]:
        """Stop sampling and return the part's load record (see `summarize`)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._sample()
        return summarize(self._samples, self._load_before)


def summarize(samples: list[dict[str, float]], load_before: float) -> dict[str, Any]:
    """Foreign cores per interval (median, max, mean over the part), load averages, and the verdict."""
    foreign = []
    total_foreign = total_wall = 0.0
    for a, b in itertools.pairwise(samples):
        wall = b["t"] - a["t"]
        if wall <= 0:
            continue
        other = max(0.0, (b["busy"] - a["busy"]) - (b["own"] - a["own"]))
        foreign.append(other / wall)
        total_foreign += other
        total_wall += wall
    mean = total_foreign / total_wall if total_wall else 0.0
    return {
        "load_avg_1min_before": round(load_before, 2),
        "load_avg_1min_max": round(max((s["load"] for s in samples), default=load_before), 2),
        "foreign_cores_mean": round(mean, 3),
        "foreign_cores_median": round(statistics.median(foreign), 3) if foreign else 0.0,
        "foreign_cores_max": round(max(foreign, default=0.0), 3),
        "quiet_limit_cores": QUIET_FOREIGN_CORES,
        "quiet": mean <= QUIET_FOREIGN_CORES,
    }
