"""NVRx's helper processes forked, with the trainer's modules loaded, from a fork server per pod.

Why: NVRx starts two helper processes per rank with multiprocessing's `spawn` (hard-coded): the persistent
checkpoint worker and the write-results Manager. Each is a fresh interpreter that imports torch, and the
worker DCP and NVRx, every time a rank process starts: at a run's start and again at every restart round
of the launcher, on the cores the ranks' restore needs (docs/nvrx-async-ckpt.md, item 11, has the
measurements).

How: the prefork zygote (trainer/launcher/prefork/) has imported torch, DCP and NVRx and runs no second
thread. Before it serves, it forks multiprocessing's own fork server (`multiprocessing.forkserver.main`,
the loop a `forkserver` start method talks to) with `start()`. Every worker the zygote then forks inherits
that server's address, and `context()` makes NVRx's `spawn` a `forkserver` start there (nvrx_async.py
installs it): the helper is forked by the server, so it begins with the modules loaded, and without any of
the rank's sockets, threads or locks (the gloo pairs, the stores, the metrics port), as a spawned one
(the server keeps none of its parent's files open but its standard streams).
What a spawned helper took from its rank that a fork of the server does not, the rank's environment (and
the thread count read from it), `HelperProcess` carries over.

Who may use the server: its socket is mode 0600 in a 0700 directory (multiprocessing's temp directory),
the rule of the zygote's own socket: only the pod's user reaches it, who can run anything in the pod
anyway. How long it lives: multiprocessing's rule, until every holder of its "alive" pipe is gone (the
zygote, the workers it forked, the helpers; each helper ends with the rank that started it,
`HelperProcess`); then it exits on its own.

A rank that no zygote forked (torchrun's, a team launcher's, a cold worker's) starts its own server the
same way at the start of its run (`start_here`), before it opens a socket or starts a thread: its helpers
are then forked from it. Where there is none (a Python whose fork server this module does not know, a
server that is gone, a process that runs threads before the run starts) `context()` is None and NVRx
spawns its helpers as shipped.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import multiprocessing
import multiprocessing.context
import os
import select
import socket
from typing import Any

log = logging.getLogger(__name__)

_KNOWN_MAIN_PARAMETERS = ("listener_fd", "alive_r", "preload", "main_path", "sys_path")
"""`multiprocessing.forkserver.main`'s parameters in Python 3.11-3.13; another signature (3.14 adds an
authentication key) is not started: the helpers are then spawned."""

_server_pidfd: int | None = None  # a pidfd of the server, inherited by the zygote's forked workers


def start() -> int | None:
    """In the zygote after its imports, before it forks a worker (or in a rank, `start_here`): fork the
    fork server and make it this process's (and its future children's) `forkserver`. Returns its PID, or
    None where it cannot be started here (the reason is logged)."""
    global _server_pidfd
    from multiprocessing import connection, forkserver, util

    known = tuple(inspect.signature(forkserver.main).parameters)
    if known != _KNOWN_MAIN_PARAMETERS or not hasattr(os, "pidfd_open"):
        log.info("helper fork server not started: multiprocessing.forkserver.main%s is not known here", known)
        return None
    address = connection.arbitrary_address("AF_UNIX")  # type: ignore[attr-defined]  # in its 0700 temp dir
    listener = socket.socket(socket.AF_UNIX)
    alive_r, alive_w = os.pipe()
    try:
        listener.bind(address)
        os.chmod(address, 0o600)
        listener.listen()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the server; its tests talk to it
            _serve(listener, alive_r)
        pidfd = os.pidfd_open(pid)
    except OSError as exc:
        log.info("helper fork server not started: %s", exc)
        listener.close()
        os.close(alive_w)
        return None
    finally:
        os.close(alive_r)
    listener.close()
    server: Any = forkserver._forkserver
    server._forkserver_address, server._forkserver_alive_fd, server._forkserver_pid = address, alive_w, pid
    # multiprocessing asks `os.waitpid(server PID)` whether its server still runs, which fails in the
    # zygote's workers (the server is their sibling's parent's child, not theirs): ask the pidfd instead.
    server.ensure_running = _ensure_running
    _server_pidfd = pidfd
    util.debug(f"helper fork server {pid} at {address}")
    return pid


def start_here() -> int | None:
    """In a rank process no zygote forked (torchrun's, a team launcher's, a cold worker's): start the
    server from this process, as the zygote does, while it still runs one Python thread and before it
    opens a socket of its own (so, at the start of the run). None where it is not started: a server is
    already there (the zygote's), or another thread runs (a fork would copy its locks mid-use)."""
    import threading

    if running():
        return None
    if threading.active_count() > 1:
        log.info("helper fork server not started: %d threads run here", threading.active_count())
        return None
    return start()


def _serve(listener: socket.socket, alive_r: int) -> None:
    """The forked server: multiprocessing's loop, from this process's imports; never returns."""
    from multiprocessing import forkserver

    code = 0
    try:
        _close_all_but(0, 1, 2, listener.fileno(), alive_r)  # alive_w too: the others' copies keep it open
        forkserver.main(listener.fileno(), alive_r, [])
    except SystemExit as exc:  # the loop's way out once every holder of the alive pipe is gone
        code = exc.code if isinstance(exc.code, int) else 0
    except BaseException:
        code = 1
    os._exit(code)


def _close_all_but(*keep: int) -> None:
    """Close every other file descriptor of this process: nothing its parent had open (a socket of a
    test runner, a team's import's file) stays open in the server or the helpers it forks."""
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd not in keep:
            with contextlib.suppress(OSError):
                os.close(fd)


def running() -> bool:
    """Whether this process has a fork server for its helpers (started here or by the zygote it was
    forked from) and the server is still there."""
    if _server_pidfd is None:
        return False
    try:
        readable, _, _ = select.select([_server_pidfd], [], [], 0)
    except (OSError, ValueError):
        return False
    return not readable  # a pidfd turns readable when its process has exited


def _ensure_running() -> None:
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()
    if not running():
        raise OSError("the pod's helper fork server is gone")


class HelperProcess(multiprocessing.context.ForkServerProcess):
    """A process forked by the server that runs with what a spawned one took from its parent: the
    environment at its creation (a rank's RANK, CUDA_VISIBLE_DEVICES, ... not the zygote's) and the
    thread count torch reads from OMP_NUM_THREADS at import (the server imported torch without it).

    And it ends with the process that started it. A spawned helper was in its rank's process group,
    which the launcher kills when a rank dies; a forked one is the server's child, in the server's group:
    after its rank's SIGKILL nothing else would end it. The NVRx worker's watchdog killed the Manager
    then, but the worker itself exits at that moment too (its request pipe breaks), and once in a few runs
    its exit cut the watchdog off before the kill: the Manager, and the fork server it holds open, lived on
    (seen in CI). So every helper watches its creator itself (`_end_with`), from a pidfd the creator hands
    over with the process object: never a later process that got its PID."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._parent_environ = dict(os.environ)
        self._creator_pidfd: int | None = None

    def start(self) -> None:
        self._creator_pidfd = os.pidfd_open(os.getpid())
        try:
            super().start()
        finally:
            os.close(self._creator_pidfd)
            self._creator_pidfd = None

    def __getstate__(self) -> dict[str, Any]:
        """Pickled for the server by `start` (multiprocessing's forkserver Popen): the pidfd goes along
        as one of the files the server hands to the new process."""
        from multiprocessing import reduction

        state = dict(self.__dict__)
        if self._creator_pidfd is not None:
            state["_creator_pidfd"] = reduction.DupFd(self._creator_pidfd)
        return state

    def run(self) -> None:
        creator = self.__dict__.pop("_creator_pidfd", None)
        if creator is not None:
            _end_with(creator.detach())
        os.environ.clear()
        os.environ.update(self._parent_environ)
        apply_thread_count(self._parent_environ)
        super().run()


def _end_with(creator_pidfd: int) -> None:
    """In a helper, first thing: a daemon thread that SIGKILLs this process and its descendants (an NVRx
    worker's writers) once the creator's pidfd turns readable (it exited, however it ended)."""
    import signal
    import threading

    def watch() -> None:
        select.select([creator_pidfd], [], [])
        for pid in [*descendants(os.getpid()), os.getpid()]:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)

    threading.Thread(target=watch, name="helper-lifeline", daemon=True).start()


def descendants(pid: int) -> list[int]:
    """Every descendant of process `pid`, children first ([] without psutil, which ships with NVRx)."""
    try:
        import psutil
    except ImportError:
        return []
    try:
        return [child.pid for child in psutil.Process(pid).children(recursive=True)]
    except psutil.Error:
        return []


class HelperContext(multiprocessing.context.ForkServerContext):
    Process = HelperProcess


_HELPER_CONTEXT = HelperContext()


def context() -> HelperContext | None:
    """The context to start a helper with in this process: forked by the server, or None (spawn it)."""
    return _HELPER_CONTEXT if running() else None


def apply_thread_count(environ: dict[str, str]) -> None:
    """torch's intra-op thread count from OMP_NUM_THREADS, for a process that imported torch before it
    had that environment (a fork of the zygote or of the server)."""
    threads = environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:
        import torch

        with contextlib.suppress(RuntimeError):  # set already, after parallel work began
            torch.set_num_threads(int(threads))
