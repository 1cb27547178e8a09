"""One control-plane component as a child process: its own process group, its log file, a readiness
probe, and a stop that leaves nothing behind.

A component is started in a new session (its own process group), so a stop reaches every process it
forked, and with a parent-death signal, so a launcher killed outright (SIGKILL, an OOM kill) does not leave
an API server holding ports: the kernel sends SIGTERM to the component when the thread that started it
dies. Start components from a thread that lives as long as the control plane (the main thread, a pytest
fixture's thread).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

STOP_GRACE_S = 10.0
"""How long a component may take to exit after SIGTERM before its process group is killed."""
LOG_TAIL_LINES = 15
_PR_SET_PDEATHSIG = 1


class ControlPlaneError(RuntimeError):
    """A component failed to start or to become ready. The first line names the component; the lines
    after it are the tail of its log."""


def _die_with_parent() -> None:
    # Runs in the child between fork and exec.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return "\n".join(text.rstrip().splitlines()[-lines:]) or "(empty log)"


@dataclass
class Component:
    """A started component: its name, process and log file."""

    name: str
    process: subprocess.Popen[bytes]
    log: Path
    started_at: float = field(default_factory=time.monotonic)

    def failure(self, what: str) -> ControlPlaneError:
        code = self.process.poll()
        exited = f" (exited with code {code})" if code is not None else ""
        return ControlPlaneError(
            f"{self.name} {what}{exited}; last lines of {self.log}:\n{log_tail(self.log)}"
        )

    def stop(self, grace_s: float = STOP_GRACE_S) -> None:
        """SIGTERM to the whole process group, SIGKILL to what is left after `grace_s`; reaped."""
        pgid = self.process.pid  # the component leads its own session, so its group id is its pid
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=grace_s)
        # Children of the component (none expected) die with the group even when the leader exited.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGKILL)
        self.process.wait()


def start(name: str, binary: Path, args: Sequence[str], log_dir: Path) -> Component:
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"{name}.log"
    with log.open("ab") as out:
        process = subprocess.Popen(
            [str(binary), *args],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
    return Component(name, process, log)


def https_get(url: str, *, ca_file: Path | None, token: str | None = None, timeout: float = 2.0) -> int:
    """The status code of a GET; 0 when nothing answered. Without `ca_file` the server's certificate is
    not checked (a component's self-signed serving certificate, probed on 127.0.0.1 only)."""
    if url.startswith("https://"):
        context = (
            ssl.create_default_context(cafile=str(ca_file)) if ca_file else ssl._create_unverified_context()
        )
    else:
        context = None
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
            return int(response.status)
    except urllib.error.HTTPError as error:
        return int(error.code)
    except (OSError, ssl.SSLError):
        return 0


def wait_until(component: Component, ready: Callable[[], bool], timeout_s: float, what: str) -> float:
    """Poll `ready` until it holds; seconds it took. Fails fast, naming the component, when the process
    exits or the deadline passes."""
    start_time = time.monotonic()
    deadline = start_time + timeout_s
    delay = 0.05
    while True:
        if ready():
            return time.monotonic() - start_time
        if component.process.poll() is not None:
            raise component.failure(f"exited before {what}")
        if time.monotonic() > deadline:
            raise component.failure(f"not {what} after {timeout_s:.0f} s")
        time.sleep(delay)
        delay = min(delay * 1.5, 0.5)
