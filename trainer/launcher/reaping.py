"""The pod's main process and its children: reparented orphans reaped, a dead child's leftovers ended.

Shared by the pod's supervisor of ft_launcher (supervise.py) and the rendezvous service's Keeper
(rendezvous.py): each is its container's main process (PID 1, or a child subreaper elsewhere), to which
the descendants of a child that died are reparented.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

_PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> None:
    """Have orphaned descendants reparented to this process (what PID 1 of a container gets anyway)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: no leftovers are tracked
        pass


def _children(of: int) -> list[tuple[int, str]]:
    """(pid, state) of the processes whose parent is `of`, from /proc."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == of:
            found.append((int(entry.name), fields[0]))
    return found


def children_now() -> frozenset[int]:
    """This process's children at this moment. A supervisor started inside a process that already has
    children of its own (a test runner, a team's wrapper) keeps them: they are nobody's leftovers."""
    return frozenset(pid for pid, _ in _children(os.getpid()))


def reap_orphans(keep: set[int] | frozenset[int]) -> None:
    """Reap the exited orphans reparented here (zombies), never a process in `keep`."""
    for pid, state in _children(os.getpid()):
        if state == "Z" and pid not in keep:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)


def end_orphans(keep: set[int] | frozenset[int], grace_s: float = 5.0) -> int:
    """SIGKILL and reap every child of this process but `keep` (a dead ft_launcher's workers, stand-ins,
    rank monitors and their helpers, reparented here), repeating until none is left or `grace_s` ran
    out (a killed stand-in's forked worker follows it through its lifeline); how many were ended."""
    ended: set[int] = set()
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        left = [(pid, state) for pid, state in _children(os.getpid()) if pid not in keep]
        if not left:
            break
        for pid, state in left:
            if state != "Z":
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            ended.add(pid)
        time.sleep(0.05)
        reap_orphans(keep)
    return len(ended)
