"""Kill one process of a local job from outside, by kind, at a training step: how the tests, the bench
(bench/recovery_pods.py) and the demo (`tools/demo.py --kill`) lose one of a pod's own processes
reproducibly (docs/failure-domains.md).

A kill is `PROCESS:step=N[:pod=I]`:

==========  ==========================================================================================
PROCESS     the process SIGKILLed (in the pod of Job index I; without `pod`, in the lowest-indexed
            pod that has a training worker then, so that a hot spare is never the one hit)
==========  ==========================================================================================
main        the pod's main process (`python -m trainer.launcher`, the supervisor; PID 1 in a container)
launcher    ft_launcher's serving process, the supervisor's child (not its waiting warm standby)
zygote      the prefork zygote (trainer/launcher/prefork/server.py), the supervisor's child
worker      a training worker (the one with the lowest PID: a zygote's fork, or a cold `-m trainer`)
exporter    the metrics endpoint's child of local rank 0 (trainer/events/metrics_server.py); the job
            must serve metrics (bench/recovery_pods.py gives each local pod a port of its own)
rendezvous  the rendezvous service's serving process, its pod's main process' child (not the waiting
            standby beside it; its own pod: `pod` does not apply)
==========  ==========================================================================================

Why from outside, and not a fault kind the trainer fires on itself (trainer/runtime/faults.py): the
point is a SIGKILL that nobody in the pod sent or expected, and two of these processes are out of any
rank's reach (the rendezvous service runs in its own pod; the main process is PID 1 of the container).
A harness that reads the run's events can reach them all, with nothing added to what the trainer ships.
Keyed by step: a kill fires at the driver's first poll (0.1 s) after some rank logged step N, so within
a step of it, and a run can hold several kills at known distances. A process that is not there at that
moment (a restart in progress) is looked for again at each poll, for up to `MISS_AFTER_STEPS` steps.

Every spec is checked before the run starts, refused in one line that names the field.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal, Protocol, cast, get_args

from trainer.launcher.standby import is_standby

Process = Literal["main", "launcher", "zygote", "worker", "exporter", "rendezvous"]
PROCESSES: tuple[str, ...] = get_args(Process)
MISS_AFTER_STEPS = 5

_ZYGOTE = "trainer.launcher.prefork.server"
_LAUNCHER = "trainer.launcher.ft"
_EXPORTER = "trainer.events.metrics_server"
_RENDEZVOUS = "trainer.launcher.rendezvous"


@dataclass(frozen=True)
class Kill:
    process: Process
    step: int
    pod: int | None = None
    """None: a pod that trains (module doc)."""

    @property
    def spec(self) -> str:
        return f"{self.process}:step={self.step}" + (f":pod={self.pod}" if self.pod is not None else "")


def parse(spec: str) -> Kill:
    """`PROCESS:step=N[:pod=I]`; ValueError in one line naming the field."""
    head, *fields = spec.strip().split(":")
    if head not in PROCESSES:
        raise ValueError(f"kill {spec!r}: process {head!r} is not one of {', '.join(PROCESSES)}")
    values: dict[str, int] = {}
    for field in fields:
        name, sep, value = field.partition("=")
        if not sep or name not in ("step", "pod"):
            raise ValueError(f"kill {spec!r}: {field!r} is not step=N or pod=I")
        if name in values:
            raise ValueError(f"kill {spec!r}: {name} given twice")
        if not value.isdigit():
            raise ValueError(f"kill {spec!r}: {name} must be a whole number >= 0, not {value!r}")
        values[name] = int(value)
    if "step" not in values:
        raise ValueError(f"kill {spec!r}: step=N is required")
    if head == "rendezvous" and "pod" in values:
        raise ValueError(f"kill {spec!r}: pod does not apply to the rendezvous service (its own pod)")
    return Kill(cast(Process, head), values["step"], values.get("pod"))


def parse_all(specs: Iterable[str], pods: int) -> tuple[Kill, ...]:
    """Every spec parsed, each pod index within the job's `pods`."""
    kills = tuple(parse(s) for s in specs)
    for kill in kills:
        if kill.pod is not None and kill.pod >= pods:
            raise ValueError(f"kill {kill.spec!r}: pod {kill.pod} is not a Job index (0..{pods - 1})")
    return kills


class Job(Protocol):
    """What of tools/localjob.LocalJob a kill needs."""

    def pod(self, index: int) -> Any: ...

    def attempt(self, index: int) -> int: ...

    def rendezvous_pod(self) -> Any: ...


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent PID, session id) of `pid`, None when it is gone or a zombie."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] == "Z" else (int(fields[1]), int(fields[3]))


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _threads(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return 0


def find(process: Process, main: int, procs: Iterable[int]) -> list[int]:
    """The PIDs of `process` among a pod's processes `procs` (main process `main`), lowest first.

    A forked worker carries the zygote's command line; it is told from the zygote by leading its own
    session (the zygote stays in the pod's). A cold worker and a forked one's stand-in share theirs
    (`python -u -m trainer`); the stand-in runs one thread, a worker many (torch's)."""
    if process == "main":
        return [main]
    info = {
        p: (s, _cmdline(p))
        for p in procs
        if p != main and (s := _stat(p)) is not None and not is_standby(p)  # standby.py: a spare process
    }
    found = []
    for pid, ((ppid, sid), cmd) in info.items():
        if process == "launcher":
            hit = ppid == main and _LAUNCHER in cmd
        elif process == "rendezvous":
            hit = ppid == main and _RENDEZVOUS in cmd
        elif process == "zygote":
            hit = ppid == main and _ZYGOTE in cmd and sid != pid
        elif process == "exporter":
            hit = _EXPORTER in cmd
        else:  # worker
            parent_cmd = info.get(ppid, ((0, 0), ""))[1]
            forked = _ZYGOTE in cmd and sid == pid
            cold = " -m trainer " in f"{cmd} " and _LAUNCHER in parent_cmd and _threads(pid) > 1
            hit = forked or cold
        if hit:
            found.append(pid)
    return sorted(found)


@dataclass
class Done:
    """What one kill did: when (wall clock, as the events' `t`), at which logged step, which PIDs;
    `missed`: why nothing was killed."""

    spec: str
    process: str
    pod: int | None
    t: float | None = None
    step: int | None = None
    pids: tuple[int, ...] = ()
    missed: str = ""


class Schedule:
    """Fires each kill once, at the first call that sees its step logged; `done` records them in order."""

    def __init__(
        self, kills: Sequence[Kill], job: Job, pods: int, log: Callable[[str], Any] = lambda _m: None
    ) -> None:
        self.pending = sorted(kills, key=lambda k: k.step)
        self.job, self.pods, self.log = job, pods, log
        self.done: list[Done] = []

    def __call__(self, events: Sequence[dict[str, Any]]) -> None:
        if not self.pending:
            return
        step = max((int(e["step"]) for e in events if e["ev"] == "step"), default=-1)
        for kill in [k for k in self.pending if step >= k.step]:
            index, pids = self._kill(kill)
            if not pids and step < kill.step + MISS_AFTER_STEPS:
                continue  # a restart in progress: look again at the next poll
            self.pending.remove(kill)
            missed = "" if pids else f"no {kill.process} process through step {step}"
            done = Done(kill.spec, kill.process, index, time.time(), step, tuple(pids), missed)
            self.done.append(done)
            self.log(f"kill {kill.spec}: " + (missed or f"SIGKILLed {list(pids)} at step {step}"))

    def _kill(self, kill: Kill) -> tuple[int | None, list[int]]:
        """(the pod's index, the PIDs killed) of `kill` now."""
        if kill.process == "rendezvous":
            service = self.job.rendezvous_pod()
            if service is None:
                return None, []
            pids = find("rendezvous", service.pid, service.processes())[:1]
            return None, [pid for pid in pids if _sigkill(pid)]
        for index in [kill.pod] if kill.pod is not None else range(self.pods):
            if self.job.attempt(index) < 0:
                continue
            pod = self.job.pod(index)
            procs = pod.processes()
            pids = find(kill.process, pod.pid, procs)[:1]
            if kill.pod is None and not (pids and find("worker", pod.pid, procs)):
                continue  # a spare, or a pod between worker groups
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    return index, []
            return index, pids
        return None, []

    def records(self) -> list[dict[str, Any]]:
        return [asdict(d) for d in self.done]


def _sigkill(pid: int) -> bool:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        return False
    return True


def step_times(events: Iterable[dict[str, Any]]) -> list[tuple[float, int]]:
    """(t, step) of every step event of any rank, in time order."""
    return sorted((float(e["t"]), int(e["step"])) for e in events if e["ev"] == "step")


def extra_wall_s(
    faulted: Sequence[tuple[float, int]], clean: Sequence[tuple[float, int]], t_kill: float, window: int
) -> float | None:
    """The wall time a kill at `t_kill` added: from the newest step logged before it (step a) until the
    run logged step a + `window` again after it, less the time the fault-free run took from a to
    a + window (step_times of each run). `window` must reach past the recovery and short of the next
    kill. None when the run never got there."""
    before = [(t, s) for t, s in faulted if t <= t_kill]
    if not before:
        return None
    t_a, a = max(before, key=lambda ts: (ts[1], ts[0]))
    target = a + window
    after = [t for t, s in faulted if t > t_kill and s == target]
    clean_a = [t for t, s in clean if s == a]
    clean_b = [t for t, s in clean if s == target]
    if not after or not clean_a or not clean_b:
        return None
    return (min(after) - t_a) - (min(clean_b) - min(clean_a))


def bound_s(worst_mttr_s: float) -> float:
    """What one outside kill may cost the job: twice the worst single fault's recovery, plus 10 s."""
    return 2 * worst_mttr_s + 10.0
