"""Run Kubernetes-style "pods" as local process trees, and an Indexed-Job-like controller over them.

A pod here is one command (the chart's pod command: `ft_launcher ... -m trainer ...`) started in a new
session, plus every process it spawns. Killing a pod must kill all of them at once, as losing a node does.
A process group is not enough for that: torch's launcher starts each worker with `start_new_session=True`,
so workers sit in their own sessions and groups, and `killpg` of the launcher's group misses them. So each
pod gets a unique marker in its environment, which every descendant inherits (ft_launcher copies its
environment into workers and forks its rank monitors), and a pod is "every process whose initial
environment carries the marker", found through /proc. That also catches processes already orphaned.

`LocalJob` plays the Job controller for an Indexed Job: it starts one pod per index, replaces a pod that
died (a new attempt with the same index and a fresh marker), and finishes when every index has exited 0.
Pods killed through `kill_pod` count as disruptions (a lost node, which a podFailurePolicy `Ignore` rule on
`DisruptionTarget` does not count), other failures count against `backoff_limit`, and an exit code listed
in `fail_job_exit_codes` fails the job at once (podFailurePolicy `FailJob`).

Linux only (/proc). Usage:

    job = LocalJob([PodSpec("pod-0", argv0, env0, log0), PodSpec("pod-1", argv1, env1, log1)])
    with job:
        job.start()
        ...
        job.kill_pod(1)            # node lost: the controller starts pod-1 again
        result = job.wait(timeout_s=120)

From the shell (`{port}`: a free rendezvous port, `{index}`: the pod index):

    python -m tools.localpods --pods 2 --kill 1@40 -- ft_launcher --nnodes=2 ... \
        --rdzv-endpoint=127.0.0.1:{port} ... -m trainer ...
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

#: Environment variable carrying a pod's marker; every process of the pod inherits it.
POD_MARKER_ENV = "LOCALPOD_MARKER"


def _pids_with_marker(marker: str) -> set[int]:
    """PIDs of live processes whose initial environment contains POD_MARKER_ENV=marker."""
    needle = f"{POD_MARKER_ENV}={marker}".encode()
    found: set[int] = set()
    me = os.getpid()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as fh:
                env = fh.read()
        except OSError:  # gone, or not ours
            continue
        if needle in env.split(b"\0"):
            found.add(int(entry.name))
    return found


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            # The state follows the command name, which is in parentheses and may contain spaces.
            return fh.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except (OSError, IndexError):
        return True


def _signal_quietly(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.kill(pid, sig)


@dataclass
class LocalPod:
    """One pod: `argv` run with `env` in a new session, output to `log_path` (appended)."""

    name: str
    argv: Sequence[str]
    env: Mapping[str, str]
    log_path: Path
    marker: str = field(default_factory=lambda: uuid.uuid4().hex)
    _proc: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    _log: IO[bytes] | None = field(default=None, init=False, repr=False)

    def start(self) -> None:
        """Start the pod's command in a new session (its own process group, no controlling terminal)."""
        if self._proc is not None:
            raise RuntimeError(f"pod {self.name} was already started")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in wait()/kill()
        env = {**self.env, POD_MARKER_ENV: self.marker}
        self._proc = subprocess.Popen(
            list(self.argv), env=env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )

    @property
    def pid(self) -> int:
        """PID of the pod's main process (the container's entrypoint)."""
        if self._proc is None:
            raise RuntimeError(f"pod {self.name} is not started")
        return self._proc.pid

    def processes(self) -> set[int]:
        """Live (non-zombie) processes of this pod, main process included."""
        pids = _pids_with_marker(self.marker)
        return {p for p in pids if not _is_zombie(p)}

    def poll(self) -> int | None:
        """The main process's exit code (negative: killed by that signal), or None while it runs."""
        if self._proc is None:
            raise RuntimeError(f"pod {self.name} is not started")
        rc = self._proc.poll()
        if rc is not None:
            self._close_log()
        return rc

    def kill(self) -> set[int]:
        """Lose the pod like a node: SIGKILL every process of it at once; returns the PIDs killed.

        Processes are first stopped, rescanning until no new ones appear, so nothing can fork or react
        (a launcher restarting workers, a worker noticing its peer) between the scan and the kill.
        """
        stopped: set[int] = set()
        for _ in range(50):
            new = _pids_with_marker(self.marker) - stopped
            if not new:
                break
            for pid in new:
                _signal_quietly(pid, signal.SIGSTOP)
            stopped |= new
        for pid in stopped:
            _signal_quietly(pid, signal.SIGKILL)
        if self._proc is not None:
            self._proc.wait()
        self._close_log()
        return stopped

    def terminate(self, grace_s: float = 30.0) -> int:
        """Delete the pod the kubelet way: SIGTERM to the main process, SIGKILL of all after `grace_s`."""
        if self._proc is None:
            raise RuntimeError(f"pod {self.name} is not started")
        _signal_quietly(self._proc.pid, signal.SIGTERM)
        try:
            rc = self._proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            self.kill()
            rc = self._proc.wait()
        # Whatever the main process left behind dies with the pod's sandbox.
        for pid in self.processes():
            _signal_quietly(pid, signal.SIGKILL)
        self._close_log()
        return rc

    def wait(self, timeout_s: float | None = None) -> int:
        """Wait for the main process to exit and return its exit code."""
        if self._proc is None:
            raise RuntimeError(f"pod {self.name} is not started")
        rc = self._proc.wait(timeout=timeout_s)
        self._close_log()
        return rc

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None


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
        on_event: Callable[[str, dict[str, Any]], None] | None = None,
    ) -> None:
        """`backoff_limit`: pod failures (not disruptions) tolerated; `replace_delay_s`: time before a
        replacement starts (a real scheduler takes seconds to minutes); `on_event(kind, fields)`: progress
        callback ("pod_start", "pod_exit").

        `host_port`: the rendezvous port that pod 0's launcher serves. On a cluster only pod 0 matches
        the endpoint's host name, so it alone hosts the c10d store. On one machine every launcher
        matches 127.0.0.1 and the first to bind wins, so `start` waits (up to `host_wait_s`) until
        pod 0 listens there before starting the others; replacements of other pods then join as
        clients."""
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
        """Start every index's first pod, in index order (index 0 first, as the rendezvous host)."""
        for index in range(len(self._specs)):
            self._start_pod(index)
            if index == 0 and self._host_port is not None:
                self._wait_listening(self._host_port)

    def pod(self, index: int) -> LocalPod:
        """The current pod of `index`."""
        return self._pods[index]

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
        """Kill every pod still running (teardown; not recorded as exits)."""
        for pod in self._pods.values():
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
        pod = LocalPod(spec.name, spec.argv, spec.env, spec.log_path)
        pod.start()
        self._pods[index] = pod
        self._emit("pod_start", {"index": index, "attempt": attempt, "pid": pod.pid, "name": spec.name})

    def _wait_listening(self, port: int) -> None:
        deadline = time.monotonic() + self._host_wait_s
        while time.monotonic() < deadline:
            if self._pods[0].poll() is not None:
                return  # pod 0 died at start; the controller deals with it in poll()
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    return
            time.sleep(0.05)
        raise TimeoutError(f"host_port: pod 0 not listening on 127.0.0.1:{port} after {self._host_wait_s} s")

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


# -- command line: run any command as N local pods -----------------------------------------------------
def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m tools.localpods --pods N [--kill INDEX@SECONDS] -- COMMAND...`; returns 0 on success.

    `{index}` and `{port}` in COMMAND become the pod index and a free rendezvous port (pod 0 is started
    first and must listen on it). Example, 2 pods x 2 ranks of the trainer:

        python -m tools.localpods --pods 2 --kill 1@40 -- ft_launcher --nnodes=2 --nproc-per-node=2 \\
            --rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:{port} --rdzv-id=local --max-restarts=3 \\
            -m trainer --data-path=out/tokens.npy --out-dir=out/local --device=cpu
    """
    import argparse

    parser = argparse.ArgumentParser(prog="python -m tools.localpods", description=main.__doc__)
    parser.add_argument("--pods", type=int, default=2, help="pods (Job indexes) to run")
    parser.add_argument("--log-dir", type=Path, default=Path("out/localpods"), help="pod-<index>.log go here")
    parser.add_argument("--backoff-limit", type=int, default=3, help="pod failures tolerated")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds before every pod is killed")
    parser.add_argument(
        "--kill", action="append", default=[], metavar="INDEX@SECONDS", help="lose pod INDEX after SECONDS"
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the pod command")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("command: give the pod command after --")
    if args.pods < 1:
        parser.error("--pods: must be >= 1")
    kills: list[tuple[float, int]] = []
    for item in args.kill:
        index, sep, seconds = item.partition("@")
        if not sep or not index.isdigit() or int(index) >= args.pods:
            parser.error(f"--kill: expected INDEX@SECONDS with INDEX < {args.pods}, got {item!r}")
        kills.append((float(seconds), int(index)))
    port = _free_port()
    specs = [
        PodSpec(
            f"pod-{i}",
            [part.replace("{index}", str(i)).replace("{port}", str(port)) for part in command],
            dict(os.environ),
            args.log_dir / f"pod-{i}.log",
        )
        for i in range(args.pods)
    ]
    uses_port = any("{port}" in part for part in command)

    def say(kind: str, fields: dict[str, Any]) -> None:
        print(f"{time.strftime('%H:%M:%S')} {kind} {fields}", flush=True)

    job = LocalJob(
        specs, backoff_limit=args.backoff_limit, host_port=port if uses_port else None, on_event=say
    )
    with job:
        job.start()
        started = time.monotonic()
        pending = sorted(kills)
        result = None
        while result is None and time.monotonic() - started < args.timeout:
            while pending and time.monotonic() - started >= pending[0][0]:
                _, index = pending.pop(0)
                say("pod_kill", {"index": index, "pids": sorted(job.kill_pod(index))})
            result = job.poll()
            time.sleep(0.2)
    if result is None:
        print(f"job: timed out after {args.timeout:.0f} s (every pod killed)", flush=True)
        return 1
    print(f"job: {'succeeded' if result.succeeded else 'failed'} ({result.reason})", flush=True)
    return 0 if result.succeeded else 1


if __name__ == "__main__":
    raise SystemExit(main())
