"""`LocalJob` plays the Job controller for an Indexed Job: it starts one pod per index, replaces a pod that
died (a new attempt with the same index and a fresh marker), and finishes when every index has exited 0.
Pods killed through `kill_pod` count as disruptions (a lost node, which a podFailurePolicy `Ignore` rule on
`DisruptionTarget` does not count), other failures count against `backoff_limit`, and an exit code listed
in `fail_job_exit_codes` fails the job at once (podFailurePolicy `FailJob`).

With a rendezvous port it also plays the chart's rendezvous Deployment: one service process
(`python -m trainer.launcher.rendezvous`, trainer/launcher/rendezvous.py) started before the pods and
replaced whenever it ends while the job runs; every pod's launcher is a client of it (`is_host=0`), so no
pod hosts the store and losing pod 0 is losing any node. `kill_rendezvous` loses it (its pod deleted);
tools/podkill.py kills only its serving process (`rendezvous_pod`), which its warm standby replaces.

The pods themselves (process trees killed whole) are tools/localpod.py.
"""

from __future__ import annotations

import shutil
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tools.localpod import LocalPod
from tools.podcommand import launcher_argv, rendezvous_argv

#: Launchers whose rendezvous takes torch's `--rdzv-conf` (and its `is_host` key).
RDZV_LAUNCHERS = ("ft_launcher", "torchrun")


def with_rdzv_host(argv: Sequence[str], is_host: bool) -> list[str]:
    """`argv` with `is_host=1|0` added to its launcher's `--rdzv-conf`.

    The chart renders `is_host=0` (the rendezvous service hosts the store); a hand-written local command
    may not, and on one machine every launcher matches 127.0.0.1 (torch counts every loopback address as
    this machine): each one then closed the barrier rendezvous' rounds on its own (seen: two pods given
    the same node rank). An `is_host` entry already there is replaced. Commands that are not a launcher
    are returned as they are.
    """
    argv = list(argv)
    flag = f"is_host={int(is_host)}"
    first = len(argv) - len(launcher_argv(argv))  # past the preforkWorkers wrapper, if any
    for i, arg in enumerate(argv[first:], start=first):
        if arg.startswith(("--rdzv-conf=", "--rdzv_conf=")):
            name, _, conf = arg.partition("=")
            argv[i] = f"{name}={_with_key(conf, flag)}"
            return argv
        if arg in ("--rdzv-conf", "--rdzv_conf") and i + 1 < len(argv):
            argv[i + 1] = _with_key(argv[i + 1], flag)
            return argv
        if arg == "-m":
            break  # the trainer's own arguments follow
    if first < len(argv) and Path(argv[first]).name in RDZV_LAUNCHERS:
        argv.insert(first + 1, f"--rdzv-conf={flag}")
    return argv


def _with_key(conf: str, flag: str) -> str:
    """A --rdzv-conf value with `flag` (key=value) in place of any entry with the same key."""
    key = flag.partition("=")[0]
    kept = [kv for kv in conf.split(",") if kv and kv.partition("=")[0] != key]
    return ",".join([*kept, flag])


@dataclass(frozen=True)
class PodSpec:
    """What the controller needs to (re)create the pod of one index."""

    name: str
    argv: Sequence[str]
    env: Mapping[str, str]
    log_path: Path
    fresh_dirs: tuple[Path, ...] = ()
    """Emptied before each pod of this index starts: a pod's emptyDir volumes (its /dev/shm) do not
    survive into its replacement."""


@dataclass(frozen=True)
class PodExit:
    """One pod attempt that ended: its index, attempt number, exit code, why and when (unix time)."""

    index: int
    attempt: int
    returncode: int
    reason: str  # "succeeded", "failed", "disrupted" (killed as a lost node), "fail-job"
    t: float


@dataclass(frozen=True)
class JobResult:
    """The job's outcome: `succeeded` when every index exited 0; every pod attempt that ended."""

    succeeded: bool
    reason: str
    exits: tuple[PodExit, ...]

    def attempts(self, index: int) -> int:
        """How many pods were started for `index` and ended."""
        return sum(1 for e in self.exits if e.index == index)


class LocalJob:
    """An Indexed Job on this machine: one LocalPod per index, replaced when it dies."""

    def __init__(
        self,
        pods: Sequence[PodSpec],
        *,
        backoff_limit: int = 0,
        fail_job_exit_codes: Sequence[int] = (),
        replace_delay_s: float = 0.0,
        host_port: int | None = None,
        host_wait_s: float = 30.0,
        rendezvous_log: Path | None = None,
        rendezvous_restart_delay_s: float = 0.5,
        on_event: Callable[[str, dict[str, Any]], None] | None = None,
    ) -> None:
        """`backoff_limit`: pod failures (not disruptions) tolerated; `replace_delay_s`: time before a
        replacement starts (a real scheduler takes seconds to minutes); `on_event(kind, fields)`: progress
        callback ("pod_start", "pod_exit").

        `host_port`: the rendezvous port. The rendezvous service (its command derived from pod 0's
        launcher options, `rendezvous_argv`; log `rendezvous_log`, default beside pod 0's) listens there
        before any pod starts (`start` waits up to `host_wait_s`), and every launcher is told it is
        a client (`is_host=0`, `with_rdzv_host`: on one machine every launcher matches 127.0.0.1 and
        would otherwise try to host). The service is replaced `rendezvous_restart_delay_s` after it
        ends while the job runs (a Deployment's new pod; a real one takes seconds)."""
        if not pods:
            raise ValueError("pods: at least one pod is needed")
        if backoff_limit < 0:
            raise ValueError("backoff_limit: must be >= 0")
        if replace_delay_s < 0:
            raise ValueError("replace_delay_s: must be >= 0")
        self._specs = list(pods)
        self._backoff_limit = backoff_limit
        self._fail_job_codes = frozenset(fail_job_exit_codes)
        self._replace_delay_s = replace_delay_s
        self._host_port = host_port
        self._host_wait_s = host_wait_s
        self._rendezvous_log = rendezvous_log or self._specs[0].log_path.with_name("rendezvous.log")
        self._rendezvous_restart_delay_s = rendezvous_restart_delay_s
        self._rendezvous: LocalPod | None = None
        self._rendezvous_starts = 0
        self._rendezvous_due: float | None = None
        self._on_event = on_event
        self._pods: dict[int, LocalPod] = {}
        self._attempt: dict[int, int] = {}
        self._done: set[int] = set()
        self._disrupted: set[int] = set()  # indexes whose current pod was killed by kill_pod
        self._pending: dict[int, float] = {}  # index -> time its replacement may start
        self._exits: list[PodExit] = []
        self._failures = 0
        self._result: JobResult | None = None

    # -- lifecycle -------------------------------------------------------------------------------
    def __enter__(self) -> LocalJob:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        """Start the rendezvous service (with a rendezvous port), then every index's first pod."""
        if self._host_port is not None:
            self._start_rendezvous()
            self._wait_listening(self._host_port)
        for index in range(len(self._specs)):
            self._start_pod(index)

    @property
    def rendezvous_starts(self) -> int:
        """How many rendezvous service processes were started (1 + replacements)."""
        return self._rendezvous_starts

    def kill_rendezvous(self) -> set[int]:
        """Lose the rendezvous service (SIGKILL, no socket closed); it is replaced while the job runs."""
        if self._rendezvous is None:
            raise RuntimeError("kill_rendezvous: this job has no rendezvous service (no host_port)")
        return self._rendezvous.kill()

    def rendezvous_pod(self) -> LocalPod | None:
        """The rendezvous service's pod (its main process runs the serving process and a warm standby:
        trainer/launcher/rendezvous.py `Keeper`), None without one."""
        return self._rendezvous

    def pod(self, index: int) -> LocalPod:
        """The current pod of `index`."""
        return self._pods[index]

    def attempt(self, index: int) -> int:
        """The attempt number of the current pod of `index` (0: the first; -1: not started)."""
        return self._attempt.get(index, -1)

    def log_path(self, index: int) -> Path:
        """Where the pods of `index` write their output (every attempt appends)."""
        return Path(self._specs[index].log_path)

    @property
    def exits(self) -> tuple[PodExit, ...]:
        """Every pod attempt that ended so far."""
        return tuple(self._exits)

    def kill_pod(self, index: int) -> set[int]:
        """Lose the node of `index`: SIGKILL its whole pod; the controller will replace it."""
        self._disrupted.add(index)
        return self._pods[index].kill()

    def poll(self) -> JobResult | None:
        """Reap ended pods, start due replacements; the result once the job has finished."""
        if self._result is not None:
            return self._result
        now = time.time()
        self._keep_rendezvous(now)
        for index, pod in list(self._pods.items()):
            if index in self._done or index in self._pending:
                continue
            rc = pod.poll()
            if rc is None:
                continue
            reason = self._classify(index, rc)
            self._record(PodExit(index, self._attempt[index], rc, reason, now))
            if reason == "succeeded":
                self._done.add(index)
            elif reason == "fail-job":
                return self._finish(False, f"pod {pod.name} exited {rc} (FailJob rule)")
            else:
                if reason == "failed":
                    self._failures += 1
                    if self._failures > self._backoff_limit:
                        return self._finish(False, f"backoff limit {self._backoff_limit} exceeded")
                self._pending[index] = now + self._replace_delay_s
        for index, due in list(self._pending.items()):
            if now >= due:
                del self._pending[index]
                self._start_pod(index)
        if len(self._done) == len(self._specs):
            return self._finish(True, "every index completed")
        return None

    def wait(self, timeout_s: float, poll_s: float = 0.2) -> JobResult:
        """Run the controller until the job finishes; on timeout stop every pod and report it."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            result = self.poll()
            if result is not None:
                return result
            time.sleep(poll_s)
        return self._finish(False, f"timed out after {timeout_s:.0f} s")

    def stop(self) -> None:
        """Kill every pod still running and the rendezvous service (teardown; not recorded as exits)."""
        for pod in [*self._pods.values(), *([self._rendezvous] if self._rendezvous else [])]:
            try:
                if pod.poll() is None or pod.processes():
                    pod.kill()
            except RuntimeError:
                continue

    # -- internals -------------------------------------------------------------------------------
    def _start_pod(self, index: int) -> None:
        spec = self._specs[index]
        attempt = self._attempt.get(index, -1) + 1
        self._attempt[index] = attempt
        self._disrupted.discard(index)
        for directory in spec.fresh_dirs:
            shutil.rmtree(directory, ignore_errors=True)
            directory.mkdir(parents=True)
        argv = with_rdzv_host(spec.argv, False) if self._host_port is not None else list(spec.argv)
        pod = LocalPod(spec.name, argv, spec.env, spec.log_path)
        pod.start()
        self._pods[index] = pod
        self._emit("pod_start", {"index": index, "attempt": attempt, "pid": pod.pid, "name": spec.name})

    def _start_rendezvous(self) -> None:
        spec = self._specs[0]
        argv = rendezvous_argv(with_rdzv_host(spec.argv, False))
        env = {k: v for k, v in spec.env.items() if not k.startswith("TRAINER_PREFORK")}
        self._rendezvous = LocalPod("rendezvous", argv, env, self._rendezvous_log)
        self._rendezvous.start()
        self._rendezvous_starts += 1
        self._emit("rendezvous_start", {"pid": self._rendezvous.pid, "start": self._rendezvous_starts})

    def _keep_rendezvous(self, now: float) -> None:
        """The Deployment's part: a rendezvous service that ended is replaced after the restart delay."""
        if self._rendezvous is None:
            return
        if self._rendezvous_due is None:
            rc = self._rendezvous.poll()
            if rc is None:
                return
            self._emit("rendezvous_exit", {"returncode": rc})
            self._rendezvous_due = now + self._rendezvous_restart_delay_s
        if now >= self._rendezvous_due:
            self._rendezvous_due = None
            self._start_rendezvous()

    def _wait_listening(self, port: int) -> None:
        deadline = time.monotonic() + self._host_wait_s
        while time.monotonic() < deadline:
            if self._rendezvous is not None and self._rendezvous.poll() is not None:
                raise RuntimeError(f"the rendezvous service exited at start: see {self._rendezvous_log}")
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    return
            time.sleep(0.05)
        raise TimeoutError(
            f"host_port: the rendezvous service is not listening on 127.0.0.1:{port} "
            f"after {self._host_wait_s} s"
        )

    def _classify(self, index: int, rc: int) -> str:
        if index in self._disrupted:
            return "disrupted"
        if rc == 0:
            return "succeeded"
        if rc in self._fail_job_codes:
            return "fail-job"
        return "failed"

    def _record(self, ex: PodExit) -> None:
        self._exits.append(ex)
        self._emit(
            "pod_exit",
            {"index": ex.index, "attempt": ex.attempt, "returncode": ex.returncode, "reason": ex.reason},
        )

    def _finish(self, ok: bool, reason: str) -> JobResult:
        if not ok:
            self.stop()
        self._result = JobResult(ok, reason, tuple(self._exits))
        return self._result

    def _emit(self, kind: str, fields: dict[str, Any]) -> None:
        if self._on_event is not None:
            self._on_event(kind, fields)
