"""A worker's stand-in: have the pod's zygote fork the worker, then mirror it to the launcher.

Imports nothing heavy: this is the process ft_launcher starts, and its whole point is to skip the imports.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import time
from collections.abc import Sequence

from trainer.launcher.prefork import PID_ENV, SOCKET_ENV, wire

READY_WAIT_S = 180.0
"""How long a worker waits for a zygote that is still importing (it is alive, its socket not bound yet).
The first round of a pod starts while the zygote imports; waiting costs nothing then, as a cold start
would import the same modules on the same cores."""
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def run_forked(module: str, argv: Sequence[str]) -> int | None:
    """Run `python -m module argv` as a child of the zygote; its exit status (-N: killed by signal N,
    re-raised on this process). None when there is no zygote to ask: the caller starts cold."""
    sock = _connect(os.environ.get(SOCKET_ENV, ""), os.environ.get(PID_ENV, ""))
    if sock is None:
        return None
    # The write end never leaves this process and is never closed by it: it closes when this process
    # ends, however it ends, and then the worker's lifeline thread kills the worker.
    lifeline_r, _lifeline_w = os.pipe()
    stdio = [_fd_or_devnull(fd) for fd in (0, 1, 2)]
    request = {
        "module": module,
        "argv": list(argv),
        "env": dict(os.environ),
        "cwd": os.getcwd(),
        "launcher_pid": os.getppid(),
    }
    try:
        wire.send_request(sock, request, [*stdio, lifeline_r])
        first = wire.recv_record(sock)
    except (OSError, wire.ProtocolError) as exc:
        print(f"prefork: zygote did not start the worker ({exc}); starting cold", file=sys.stderr, flush=True)
        sock.close()
        return None
    finally:
        os.close(lifeline_r)
    if first is None or first[0] != b"P":
        print("prefork: zygote closed the connection; starting cold", file=sys.stderr, flush=True)
        return None
    worker = first[1]
    for sig in FORWARDED:
        signal.signal(sig, lambda signum, _frame: _forward(worker, signum))
    record = wire.recv_record(sock)
    if record is None or record[0] != b"X":  # the zygote died: the worker's status is lost with it
        _forward(worker, signal.SIGKILL)
        return 1
    code = os.waitstatus_to_exitcode(record[1])
    if code < 0:  # killed by a signal: die of the same one, so the launcher sees what it would have
        if -code in FORWARDED:
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        time.sleep(1.0)
    return code if code >= 0 else 128 - code


def _connect(path: str, zygote_pid: str) -> socket.socket | None:
    if not path or not zygote_pid.isdigit():
        return None
    deadline = time.monotonic() + READY_WAIT_S
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
            return sock
        except OSError:
            sock.close()
        if not _alive(int(zygote_pid)) or time.monotonic() > deadline:
            print(f"prefork: no zygote at {path}; starting cold", file=sys.stderr, flush=True)
            return None
        time.sleep(0.02)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie (exited, not yet reaped by the launcher) is not a zygote that will ever bind.
    with contextlib.suppress(OSError), open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[-1].split()[0] != "Z"
    return True


def _fd_or_devnull(fd: int) -> int:
    try:
        os.fstat(fd)
        return fd
    except OSError:
        return os.open(os.devnull, os.O_RDWR)


def _forward(pid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signum)
