"""Tier 2, the survivor's side: SIGTERM from ft_launcher -> record it -> exit promptly, non-zero.

When one worker fails, ft_launcher stops the others with SIGTERM and, after `--workers-stop-timeout`
seconds, SIGKILL; it restarts them all once they are gone. When the launcher itself gets SIGTERM (the pod
is deleted or evicted) it forwards SIGTERM to its workers (SIGKILL after `--term-timeout`). A survivor
should write its `fault_detected` event (tier 2) and leave at once, so that restart is not delayed.

Two things make "at once" harder than `signal.signal`:
* A Python handler runs only when the main thread returns to the interpreter. A survivor is usually
  blocked inside a gloo/NCCL collective waiting for the dead peer, which can last until the collective
  timeout. So the handler also arms `signal.set_wakeup_fd`: the C-level handler writes the signal number
  to a socket at once, and a daemon thread waiting on it runs the callback and exits the process, whatever
  the main thread is doing.
* The exit status must be non-zero: ft_launcher exits 0 ("ranks exited gracefully") when its workers
  exit 0 after a forwarded SIGTERM, and a deleted pod would then count as a completed Job. We exit
  128 + signum (143), like a process killed by the signal.

The exit is `os._exit`: no atexit handlers, no finalizers, no waiting on non-daemon threads (an async
checkpoint writer could block a normal exit; an unfinished checkpoint is never committed, so nothing is
lost). Callbacks therefore must flush what they write themselves; the event log is line-buffered.

A forked child (a checkpoint writer, a data loader worker) must not inherit any of this: its SIGTERM
would write to the parent's wakeup socket and terminate the parent. An at-fork hook resets the child
to the default SIGTERM behaviour. Code that later installs its own wakeup fd in the main thread (an
asyncio loop) takes the fast path away; the Python handler still works then.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

#: Longest time the callback may take before the process exits anyway.
DEFAULT_CALLBACK_TIMEOUT_S = 2.0


@dataclass
class _Installed:
    callback: Callable[[int], None]
    signals: tuple[int, ...]
    callback_timeout_s: float
    exit: Callable[[int], None]
    previous_handlers: dict[int, object] = field(default_factory=dict)
    previous_wakeup_fd: int = -1
    read_sock: socket.socket | None = None
    write_sock: socket.socket | None = None
    thread: threading.Thread | None = None
    fired: threading.Lock = field(default_factory=threading.Lock)


_installed: _Installed | None = None
_fork_hook_registered = False


def _reset_in_child() -> None:
    global _installed
    state = _installed
    if state is None:
        return
    _installed = None
    for sig in state.signals:
        signal.signal(sig, signal.SIG_DFL)
    signal.set_wakeup_fd(-1)


def install_termination_handler(
    callback: Callable[[int], None],
    *,
    signals: Iterable[int] = (signal.SIGTERM,),
    callback_timeout_s: float = DEFAULT_CALLBACK_TIMEOUT_S,
    exit_fn: Callable[[int], None] = os._exit,
) -> None:
    """On SIGTERM (or `signals`): run `callback(signum)` once, then exit the process with 128 + signum.

    Call from the main thread, once per process (a second call replaces the callback; the in-process
    Wrapper may re-run the training function, so it is idempotent in effect). `callback_timeout_s`
    bounds the callback: the process exits when it returns or when the time is up, whichever is first.
    `exit_fn` exists for tests.
    """
    global _installed, _fork_hook_registered
    if threading.current_thread() is not threading.main_thread():
        raise RuntimeError("install_termination_handler must be called from the main thread")
    if not _fork_hook_registered:
        os.register_at_fork(after_in_child=_reset_in_child)
        _fork_hook_registered = True
    if callback_timeout_s <= 0:
        raise ValueError(f"callback_timeout_s: must be > 0, got {callback_timeout_s}")
    sigs = tuple(int(s) for s in signals)
    if _installed is not None:
        _installed.callback = callback
        _installed.callback_timeout_s = callback_timeout_s
        _installed.exit = exit_fn
        return
    state = _Installed(callback=callback, signals=sigs, callback_timeout_s=callback_timeout_s, exit=exit_fn)
    state.read_sock, state.write_sock = socket.socketpair()
    state.read_sock.setblocking(True)
    state.write_sock.setblocking(False)  # the C handler must never block
    for sig in sigs:
        state.previous_handlers[sig] = signal.signal(sig, _python_handler)
    state.previous_wakeup_fd = signal.set_wakeup_fd(state.write_sock.fileno(), warn_on_full_buffer=False)
    state.thread = threading.Thread(target=_watch, args=(state,), name="termination-watch", daemon=True)
    _installed = state
    state.thread.start()


def _python_handler(signum: int, frame: object) -> None:
    # Reached only when the main thread is in the interpreter; the watcher thread usually got there first.
    state = _installed
    if state is not None:
        _terminate(state, signum)


def _watch(state: _Installed) -> None:
    read_sock = state.read_sock
    assert read_sock is not None
    while True:
        try:
            data = read_sock.recv(64)
        except OSError:
            return
        if not data:  # write end closed: the process is ending
            return
        # The wakeup fd carries every signal that has a Python handler (SIGINT, SIGCHLD, ...): pick ours.
        for signum in data:
            if signum in state.signals and _installed is state:
                _terminate(state, signum)


def _terminate(state: _Installed, signum: int) -> None:
    if not state.fired.acquire(blocking=False):
        return  # the other path (watcher or Python handler) is already terminating
    done = threading.Event()

    def run_callback() -> None:
        try:
            state.callback(signum)
        except Exception as exc:  # the exit must happen even if recording failed
            log.warning("termination callback failed: %s", exc)
        finally:
            done.set()

    threading.Thread(target=run_callback, name="termination-callback", daemon=True).start()
    if not done.wait(state.callback_timeout_s):
        log.warning("termination callback did not finish within %.1f s; exiting", state.callback_timeout_s)
    state.exit(128 + signum)
