"""A warm standby: a replacement process that has paid for its imports before it is needed.

Two of a job's processes are replaced on the recovery path and each one imports torch and NVRx first
(seconds, tens of seconds on loaded cores): ft_launcher, which a pod's supervisor starts again when its
launcher was killed or the rendezvous service was replaced (supervise.py), and the rendezvous service,
whose serving process the service's main process replaces when it dies (rendezvous.py). Each keeps one
process of the next start's kind waiting instead, imported and idle, and hands it the start.

The parent starts `python -m MODULE --standby ...` with a pipe as its stdin (`Standby`); the child calls
`begin`, imports what it will need, then blocks in `await_start`, reading one line from that pipe: a JSON
object `{"argv": [str, ...]}`, the command line of the start it takes over (what the parent would have
started cold). Only the parent holds the pipe's write end, so nobody else can start it; JSON is parsed,
nothing is unpickled. Until that line comes the child holds no port, no device and no NVRx state (imports
only), and it goes when its parent does: the kernel sends it SIGKILL (PR_SET_PDEATHSIG), and the pipe's
end of file makes it exit should it outlive that. While it waits its process name (/proc/PID/comm) is
`STANDBY_NAME` (`READY_NAME` once imported), so that tools looking for a pod's serving ft_launcher or
service (tools/podkill.py) tell the two apart (its command line keeps the `--standby` it was started
with). Once started it is the process it stands in for: its stdin is /dev/null and its name restored; it
still dies with its parent, the pod's main process, as a container's processes do with theirs (outside a
container no serving process is left behind holding a port).

Stdlib only: the supervisor that holds a standby never imports torch.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence

STANDBY_FLAG = "--standby"
"""The first argument of a standby's module command: wait for the start before doing anything."""
STANDBY_NAME = "standby"
"""A standby's /proc/PID/comm while it imports."""
READY_NAME = "standby-ready"
"""A standby's /proc/PID/comm once it waits for its start with its imports done."""
STANDBY_DELAY_S = 5.0
"""How long after the process a standby stands in for is up (ft_launcher reached the rendezvous service,
the service listens) the standby starts: its imports then do not compete for the cores with that
process's own start and its workers'."""
PARENT_ENV = "TRAINER_STANDBY_PARENT"
"""The PID of the process that started the standby, for the standby to tell it is still there."""
MAX_START_BYTES = 1 << 20
"""The longest start line accepted (a launcher's argument list is a few kB)."""
_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15
_name = ""
"""This process's name before it became a standby (`begin`), restored at its start."""


class Standby:
    """Parent side: one waiting process, started with `argv` (a module command whose first argument
    after the module is STANDBY_FLAG) and `env`."""

    def __init__(self, argv: Sequence[str], env: Mapping[str, str] | None = None) -> None:
        self.argv = list(argv)
        env = {**(os.environ if env is None else env), PARENT_ENV: str(os.getpid())}
        self.proc: subprocess.Popen[bytes] = subprocess.Popen(self.argv, stdin=subprocess.PIPE, env=env)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def start(self, args: Sequence[str]) -> subprocess.Popen[bytes] | None:
        """Hand the standby the start of command line `args`; the process now running it, or None when
        the standby is gone (the caller starts one cold). A standby still importing takes the start
        when it is done: the rest of its imports is all a start costs then."""
        if self.proc.poll() is not None or self.proc.stdin is None or self.proc.stdin.closed:
            return None
        line = json.dumps({"argv": list(args)}).encode() + b"\n"
        try:
            self.proc.stdin.write(line)
            self.proc.stdin.close()
        except OSError:  # it died between the poll and the write
            self.stop()
            return None
        return self.proc

    def stop(self) -> None:
        """End the standby (it holds nothing: SIGKILL is all it takes) and reap it."""
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        with contextlib.suppress(OSError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        self.proc.wait()


def parse_start(line: bytes) -> list[str]:
    """The argument list of a start line; ValueError naming what is wrong."""
    if len(line) > MAX_START_BYTES or not line.endswith(b"\n"):
        raise ValueError(f"start line: over {MAX_START_BYTES} bytes or cut short")
    message = json.loads(line)
    if not isinstance(message, dict) or set(message) != {"argv"}:
        raise ValueError('start line: expected {"argv": [...]}')
    argv = message["argv"]
    if not isinstance(argv, list) or not all(isinstance(a, str) for a in argv):
        raise ValueError("start line: argv must be a list of strings")
    return argv


def begin() -> None:
    """Child side, first thing (before the imports): die with the parent, and take the standby's
    process name."""
    global _name
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.environ.pop(PARENT_ENV, None) != str(os.getppid()):
        os._exit(0)  # the parent ended before the signal was armed
    _name = _comm()
    _set_comm(STANDBY_NAME)


def await_start(stdin: int = 0) -> list[str]:
    """Child side, after the imports: wait for the parent's start on `stdin` and return its arguments.
    Exits the process when the parent is gone (end of file) and exits 2 on a malformed start (nothing
    of it is run)."""
    _set_comm(READY_NAME)
    line = _read_line(stdin)
    if not line:
        os._exit(0)  # the parent is gone before it needed this standby
    try:
        argv = parse_start(line)
    except ValueError as exc:
        print(f"trainer.launcher.standby: {exc}", file=sys.stderr, flush=True)
        os._exit(2)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, stdin)
    os.close(devnull)
    _set_comm(_name)
    return argv


def _read_line(fd: int) -> bytes:
    data = b""
    while not data.endswith(b"\n") and len(data) <= MAX_START_BYTES:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        data += chunk
    return data


def _prctl(option: int, value: int) -> None:
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux
        pass


def _comm() -> str:
    try:
        with open("/proc/self/comm") as fh:
            return fh.read().strip()
    except OSError:
        return ""


def _set_comm(name: str) -> None:
    if not name:
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def is_standby(pid: int) -> bool:
    """Whether process `pid` is a standby still waiting for its start (importing or ready)."""
    return _comm_of(pid) in (STANDBY_NAME, READY_NAME)


def is_ready(pid: int) -> bool:
    """Whether process `pid` is a standby with its imports done."""
    return _comm_of(pid) == READY_NAME


def _comm_of(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/comm") as fh:
            return fh.read().strip()
    except OSError:
        return ""
