"""A worker's stand-in: have the pod's zygote fork the worker, then mirror it to the launcher.

Imports nothing heavy: this is the process ft_launcher starts, and its whole point is to skip the imports.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import socket
import sys
import time
from collections.abc import Sequence

from trainer.launcher.prefork import PID_ENV, PID_FILE_SUFFIX, SOCKET_ENV, wire

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
    # The write end never leaves this process and, once the worker runs, is never closed by it: it closes
    # when this process ends, however it ends, and then the worker's lifeline thread kills the worker.
    lifeline_r, lifeline_w = os.pipe()
    # The worker writes its exit status here as it exits: what tells this process how the worker ended
    # when the zygote (which reports it otherwise) died first.
    status_r, status_w = os.pipe()
    stdio = [_fd_or_devnull(fd) for fd in (0, 1, 2)]
    request = {
        "module": module,
        "argv": list(argv),
        "env": dict(os.environ),
        "cwd": os.getcwd(),
        "launcher_pid": os.getppid(),
    }
    why = "it closed the connection"
    try:
        wire.send_request(sock, request, [*stdio, lifeline_r, status_w])
        first = wire.recv_record(sock)
    except (OSError, wire.ProtocolError) as exc:
        why, first = str(exc), None
    finally:
        os.close(lifeline_r)
        os.close(status_w)
    if first is None or first[0] != b"P":
        print(f"prefork: zygote did not start the worker ({why}); starting cold", file=sys.stderr, flush=True)
        sock.close()
        os.close(lifeline_w)  # a worker forked before the zygote died must not run beside the cold one
        os.close(status_r)
        return None
    worker = first[1]
    watch = _pidfd(worker)  # the worker is the zygote's unreaped child now: its PID is its own
    for sig in FORWARDED:
        signal.signal(sig, lambda signum, _frame: _forward(worker, signum))
    try:
        record = wire.recv_record(sock)
    except (OSError, wire.ProtocolError):
        record = None
    if record is not None and record[0] == b"X":
        code = os.waitstatus_to_exitcode(record[1])
    else:
        code = _outlive_zygote(worker, watch, status_r)
    if code < 0:  # killed by a signal: die of the same one, so the launcher sees what it would have
        if -code in FORWARDED:
            signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
        time.sleep(1.0)
    return code if code >= 0 else 128 - code


def _outlive_zygote(worker: int, watch: int | None, status_r: int) -> int:
    """The zygote died while the worker ran: the worker trains on (reparented to the pod's main process)
    and this stand-in keeps mirroring it, so losing the zygote costs the job no restart round. Waits for
    the worker's end through its pidfd and returns its exit code from the status pipe; a worker that wrote
    none was killed by a signal, which one is lost with the zygote (reported as SIGKILL)."""
    if watch is None:  # no pidfd (Linux < 5.3): the worker cannot be watched; end it, as before
        _forward(worker, signal.SIGKILL)
        return 1
    print("prefork: the zygote died; the worker runs on", file=sys.stderr, flush=True)
    while True:
        with contextlib.suppress(InterruptedError):
            if select.select([watch], [], [])[0]:
                break
    os.close(watch)
    os.set_blocking(status_r, False)
    try:
        data = os.read(status_r, 16)
    except BlockingIOError:  # a child of the worker still holds the write end; nothing was written
        data = b""
    return int(data) if data.isdigit() else -signal.SIGKILL


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (OSError, AttributeError):  # gone already (its "X" record follows) or no pidfd here
        return None


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
        current = _current_zygote(path, zygote_pid)
        if current is None or not _alive(current) or time.monotonic() > deadline:
            print(f"prefork: no zygote at {path}; starting cold", file=sys.stderr, flush=True)
            return None
        time.sleep(0.02)


def _current_zygote(path: str, first: str) -> int | None:
    """The PID of the pod's current zygote: its PID file (a replaced zygote's), else the first one's."""
    try:
        with open(path + PID_FILE_SUFFIX) as fh:
            text = fh.read().strip()
    except OSError:
        text = first
    return int(text) if text.isdigit() else None


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
