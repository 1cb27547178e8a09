"""A rank's helper processes end with it: kill them before an exit that runs no exit handlers.

A rank starts multiprocessing children it never hands to anyone: NVRx's checkpoint worker, the
write-results Manager (a spawned server process), the Wrapper's monitor. A normal exit shuts them down
through multiprocessing's exit handlers; the two fast exits of a worker (`os._exit` after SIGTERM from the
launcher, and after the Wrapper handed recovery to tier 2) run none. The Manager was then left behind,
reparented to init, ~275 MB each, for as long as anyone looked: it was spawned from a thread whose signal
mask blocks SIGTERM (the mask survives exec), so the launcher's SIGTERM to the worker's process group
never reached it. A SIGKILLed rank runs nothing at all: for that case the checkpoint worker watches its
parent (trainer/checkpoint/nvrx_async.py) and takes the Manager along.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import signal

from trainer.checkpoint.helper_server import descendants


def kill_children() -> list[int]:
    """SIGKILL every multiprocessing child of this process and their descendants; the pids killed."""
    killed: list[int] = []
    for child in multiprocessing.active_children():
        if child.pid is None:
            continue
        for pid in [*descendants(child.pid), child.pid]:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
    return killed
