"""One local "pod": a command and every process it spawns, found through /proc and killed whole.

A pod here is one command (the chart's pod command: `ft_launcher ... -m trainer ...`) started in a new
session, plus every process it spawns. Killing a pod must kill all of them at once, as losing a node does.
A process group is not enough for that: torch's launcher starts each worker with `start_new_session=True`,
so workers sit in their own sessions and groups, and `killpg` of the launcher's group misses them. So each
pod gets a unique marker in its environment, which every descendant inherits (ft_launcher copies its
environment into workers and forks its rank monitors), and a pod is "every process whose initial
environment carries the marker", found through /proc. That also catches processes already orphaned.

A container's processes die with its main process, at once (the PID namespace goes with PID 1), so a pod
here is watched for its main process's end (a pidfd, which does not reap it) and its other processes are
killed the moment it ends, not when a controller next polls: a helper left alive even 0.2 s (NVRx's
rank monitors) reports its rank's end to the job's store, as no lost node ever could, and the job then
recovers faster than it would on Kubernetes.

Linux only (/proc). The Job controller over these pods is tools/localjob.py; the command line is
tools/localpods.py.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import threading
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

#: Environment variable carrying a pod's marker; every process of the pod inherits it.
POD_MARKER_ENV = "LOCALPOD_MARKER"

#: Every local pod shares this host's name, and NVRx >= 0.7's barrier rendezvous refuses two launchers
#: with one `socket.getfqdn()` unless this is set: its switch for simulating nodes on one machine. Set
#: here only, never in the chart (on a cluster one launcher per node is what the check protects).
LOCAL_POD_ENV = {"NVRX_ENABLE_MULTI_LAUNCHERS_PER_NODE": "1"}


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
    cwd: Path | None = None
    """The working directory (None: this process's)."""
    _proc: subprocess.Popen[bytes] | None = field(default=None, init=False, repr=False)
    _log: IO[bytes] | None = field(default=None, init=False, repr=False)
    _reaped: threading.Event = field(default_factory=threading.Event, init=False, repr=False)
    """The leftovers of an ended main process were killed (once: each scan reads every process in /proc)."""

    def start(self) -> None:
        """Start the pod's command in a new session (its own process group, no controlling terminal)."""
        if self._proc is not None:
            raise RuntimeError(f"pod {self.name} was already started")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in wait()/kill()
        env = {**LOCAL_POD_ENV, **self.env, POD_MARKER_ENV: self.marker}
        self._proc = subprocess.Popen(
            list(self.argv),
            env=env,
            cwd=self.cwd,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        threading.Thread(target=self._end_with_main, name=f"localpod-{self.name}", daemon=True).start()

    def _end_with_main(self) -> None:
        """Kill every other process of the pod as soon as its main process ends (see the module doc)."""
        assert self._proc is not None
        try:
            pidfd = os.pidfd_open(self._proc.pid)
        except (OSError, AttributeError):  # no pidfd (old kernel): poll() still kills them, later
            return
        try:
            select.select([pidfd], [], [])
        finally:
            os.close(pidfd)
        self._kill_leftovers()

    def _kill_leftovers(self) -> None:
        if self._reaped.is_set():
            return
        self._reaped.set()
        for pid in self.processes():
            _signal_quietly(pid, signal.SIGKILL)

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
            self._kill_leftovers()  # done already by the watcher, unless the kernel has no pidfd
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
