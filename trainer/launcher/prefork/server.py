"""The zygote: import the trainer once, then fork one worker per request (see
trainer/launcher/prefork/__init__).

`python -m trainer.launcher.prefork.server SOCKET PARENT_PID [MODULE]` imports PRELOAD (and MODULE, the
entry point's), binds SOCKET (mode 0600, in a
0700 directory the wrapper made) and serves until its parent (ft_launcher) dies. It stays
single-threaded, so a fork copies no lock held by another thread; each child drops everything of the
server, takes the client's stdio, environment, working directory and argv, and runs the module as
`python -m` would.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import importlib.util
import os
import selectors
import signal
import socket
import struct
import sys
import threading
import time
from typing import Any

import trainer.launcher.prefork
from trainer.checkpoint import helper_server
from trainer.launcher.prefork import PID_ENV, SOCKET_ENV, wire

PRELOAD = (
    # The worker's entry point (sets TORCH_CPP_LOG_LEVEL before torch loads) and everything the run
    # imports: the eager part of trainer.runtime.train and what it imports lazily (checkpoint backends, the
    # in-process Wrapper, NVRx's async checkpointing, torch._dynamo behind the optimizer's first step).
    "trainer.__main__",
    "trainer.config.train_config",
    "trainer.runtime.preflight",
    "trainer.runtime.train",
    "trainer.api",
    "trainer.reference",
    "trainer.checkpoint",
    "trainer.checkpoint.backends",
    "trainer.checkpoint.resume",
    "trainer.recovery.restore",
    "trainer.snapshot.replica",
    "trainer.resilience.inprocess",
    "trainer.resilience.heartbeat",
    "trainer.resilience.hangtimeout",
    "trainer.resilience.termination",
    "torch._dynamo",
    "torch.distributed.checkpoint",
    "nvidia_resiliency_ext.checkpointing.async_ckpt.torch_ckpt",
    "nvidia_resiliency_ext.fault_tolerance",
    "nvidia_resiliency_ext.inprocess",
)
PARENT_POLL_S = 0.5
_status_fd = -1  # in a forked worker: the write end of its client's status pipe (wire.py)
_PR_SET_PDEATHSIG = 1


def preload(entry_module: str | None = None) -> list[str]:
    """Import PRELOAD and the entry point's module (a team's training code: its imports, transformers
    say, are then paid once per pod, not at every worker start); returns the modules that failed (a
    worker imports those itself, and reports an entry point that cannot be imported)."""
    failed = []
    for name in (*PRELOAD, *([entry_module] if entry_module else [])):
        try:
            importlib.import_module(name)
        except Exception as exc:  # e.g. NVRx absent: the trainer then says why itself
            failed.append(f"{name} ({type(exc).__name__}: {exc})")
    gc.collect()
    gc.freeze()  # what the children share stays out of their collections (and unwritten: shared pages)
    return failed


class Zygote:
    """The listening socket, the connections of running workers, and the fork."""

    def __init__(self, path: str, parent_pid: int) -> None:
        self.path = path
        self.parent_pid = parent_pid
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.wake_r, self.wake_w = os.pipe()
        self.workers: dict[int, socket.socket] = {}  # worker PID -> its client's connection
        self.selector = selectors.DefaultSelector()

    def bind(self) -> None:
        old = os.umask(0o177)
        try:
            self.listener.bind(self.path)
        finally:
            os.umask(old)
        self.listener.listen(64)

    def serve(self) -> None:
        os.set_blocking(self.wake_w, False)
        os.set_blocking(self.wake_r, False)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # the wakeup fd is what matters
        self.selector.register(self.listener, selectors.EVENT_READ)
        self.selector.register(self.wake_r, selectors.EVENT_READ)
        while os.getppid() == self.parent_pid:
            for key, _ in self.selector.select(PARENT_POLL_S):
                if key.fileobj is self.listener:
                    self._accept()
                elif key.fileobj == self.wake_r:
                    with contextlib.suppress(BlockingIOError):
                        while os.read(self.wake_r, 4096):
                            pass
                else:  # a client's connection: readable only when it closed (that client died)
                    self._end_worker_of(key.fileobj)  # type: ignore[arg-type]
            self._reap()

    def _accept(self) -> None:
        conn, _ = self.listener.accept()
        try:
            conn.settimeout(10.0)
            if _peer_uid(conn) != os.getuid():
                raise wire.ProtocolError("a client of another user")
            request, fds = wire.recv_request(conn)
        except (OSError, ValueError, wire.ProtocolError) as exc:
            print(f"prefork: refused a request: {exc}", file=sys.stderr, flush=True)
            conn.close()
            return
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child; its own tests run it as a worker
            self._become_worker(conn, request, fds)
        for fd in fds:
            os.close(fd)
        conn.settimeout(None)
        try:
            wire.send_record(conn, b"P", pid)
        except OSError:  # the client is already gone: its lifeline ends the worker
            conn.close()
            return
        self.workers[pid] = conn
        self.selector.register(conn, selectors.EVENT_READ)

    def _end_worker_of(self, conn: socket.socket) -> None:
        """The client (the launcher's stand-in) is gone: SIGKILL the worker forked for it.

        The worker's own lifeline thread (`_die_with_client`) cannot do this for a worker that is frozen
        (SIGSTOP) or hung in C code holding the GIL: none of its threads run. Such a worker kept its
        rank monitor connection open, and the next worker of that rank waited for NVRx's heartbeat
        timeout (30 s in the tests) before its monitor took it. The worker is this process's child and not
        yet reaped, so its PID cannot have been reused."""
        self.selector.unregister(conn)
        conn.close()
        for pid, known in list(self.workers.items()):
            if known is conn:
                del self.workers[pid]
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.workers.pop(pid, None)
            if conn is not None:
                with contextlib.suppress(OSError):
                    wire.send_record(conn, b"X", status)
                self.selector.unregister(conn)
                conn.close()

    def _become_worker(self, conn: socket.socket, request: dict[str, Any], fds: list[int]) -> None:
        """In the forked child: drop the server, become `python -m <module> <argv>`; never returns."""
        code = 70
        try:
            signal.set_wakeup_fd(-1)
            for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
                signal.signal(sig, signal.SIG_DFL)
            self.selector.close()
            for sock in (conn, self.listener, *self.workers.values()):
                sock.close()
            os.close(self.wake_r)
            os.close(self.wake_w)
            os.setsid()  # its own session and group, like a worker the launcher starts
            stdin, stdout, stderr, lifeline, status = fds
            os.set_inheritable(status, False)
            global _status_fd
            _status_fd = status
            for fd, target in ((stdin, 0), (stdout, 1), (stderr, 2)):
                os.dup2(fd, target)
                os.close(fd)
            threading.Thread(target=_die_with_client, args=(lifeline,), daemon=True).start()
            code = run_module(request)
        except BaseException:
            import traceback

            traceback.print_exc()
        finally:
            _exit_like_a_cold_worker(code)


EXIT_HANDLERS_TIMEOUT_S = 20.0
"""How long a forked worker's exit handlers may take (closing the checkpoint worker is bounded at 5 s)."""


def _exit_like_a_cold_worker(code: int) -> None:
    """End the forked worker as `python -m trainer` ends: run the interpreter's exit handlers, then exit.

    A forked child must leave through os._exit (never return into the zygote's loop), and os._exit runs no
    atexit handler. Multiprocessing's is one of them: it runs the finalizers that close NVRx's checkpoint
    worker and shut the write-results Manager down. Without it every completed or given-up forked worker
    left its Manager and resource tracker behind, reparented to init, ~200 MB each (tests/orphans.py
    found them). The handlers get a bounded time; any multiprocessing child still alive after them is
    killed: nothing of this run outlives it.
    """
    import atexit
    import multiprocessing

    def last_resort() -> None:
        time.sleep(EXIT_HANDLERS_TIMEOUT_S)
        _kill_children(multiprocessing)
        _report_status(code)
        os._exit(code)

    threading.Thread(target=last_resort, name="exit-deadline", daemon=True).start()
    with contextlib.suppress(BaseException):
        atexit._run_exitfuncs()
    _kill_children(multiprocessing)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    _report_status(code)
    os._exit(code)


def _report_status(code: int) -> None:
    """Tell the client this worker's exit status, for when the zygote is no longer there to report it."""
    with contextlib.suppress(OSError):
        os.write(_status_fd, b"%d" % code)


def _kill_children(multiprocessing: Any) -> None:
    with contextlib.suppress(Exception):
        for child in multiprocessing.active_children():
            child.kill()


def run_module(request: dict[str, Any]) -> int:
    """Run the request's module as `python -m` would, in this (forked) process; its exit status."""
    import runpy

    module, argv, env, cwd = request["module"], request["argv"], request["env"], request["cwd"]
    trainer.launcher.prefork._launcher_pid = int(request["launcher_pid"])
    os.chdir(cwd)
    os.environ.clear()
    # Without the zygote's address: this process is the worker, and `python -m trainer` run below must
    # not hand itself to the zygote again.
    os.environ.update({k: v for k, v in env.items() if k not in (SOCKET_ENV, PID_ENV)})
    # torch read its thread count when the zygote imported it, without the launcher's value.
    helper_server.apply_thread_count(env)
    spec = importlib.util.find_spec(module)
    sys.argv = [spec.origin if spec and spec.origin else module, *argv]
    sys.path[0] = cwd  # `python -m` puts the working directory first
    sys.modules.pop(f"{module}.__main__", None)  # preloaded; runpy runs it afresh as __main__
    code: Any = 0
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        code = exc.code
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    # What the interpreter does at exit: wait for non-daemon threads, then the atexit hooks.
    shutdown = getattr(threading, "_shutdown", None)
    if shutdown is not None:
        shutdown()
    import atexit

    atexit._run_exitfuncs()
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _die_with_client(lifeline: int) -> None:
    """Block until the client's end of the lifeline closes (it exited or was killed), then die too."""
    with contextlib.suppress(OSError):
        while os.read(lifeline, 64):
            pass
    os.kill(os.getpid(), signal.SIGKILL)


def _peer_uid(conn: socket.socket) -> int:
    creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return int(struct.unpack("3i", creds)[1])


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when the thread that started it (ft_launcher's main) exits."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3) or not argv[1].isdigit():
        print("usage: python -m trainer.launcher.prefork.server SOCKET PARENT_PID [MODULE]", file=sys.stderr)
        return 2
    path, parent_pid = argv[0], int(argv[1])
    entry_module = argv[2] if len(argv) == 3 else None
    _die_with_parent()
    if os.getppid() != parent_pid:  # the parent died before the death signal was armed
        return 0
    t0 = time.perf_counter()
    failed = preload(entry_module)
    for line in failed:
        print(f"prefork: not preloaded: {line}", file=sys.stderr, flush=True)
    # Forked now, while this process is all imports and one thread: NVRx's helpers of every worker
    # forked below start from it instead of importing torch again (trainer/checkpoint/helper_server.py).
    helper_server.start()
    zygote = Zygote(path, parent_pid)
    zygote.bind()
    print(f"prefork: zygote ready in {time.perf_counter() - t0:.1f} s ({path})", file=sys.stderr, flush=True)
    try:
        zygote.serve()
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
