"""Warm worker starts: a pre-imported "zygote" process per pod forks every trainer worker.

Why: ft_launcher replaces every worker process of a pod at each restart round (NVRx 0.7 restarts the
whole worker group, survivors included), and a fresh `python -m trainer` spends 4-5 s importing torch,
FSDP, DCP and NVRx before it can rejoin, more when a pod's ranks import at once on shared cores: the
largest phase of a node loss's recovery. A process that has already
imported everything and forks a child per worker start skips it: the child begins with the modules
loaded and only builds the process group, the model and restores.

How it fits (Contract 2 of docs/design.md): the container runs `python -m trainer.launcher ft_launcher
...`. That wrapper starts the zygote (`server.py`) and then execs ft_launcher, so the launcher is the
container's main process exactly as before and the zygote is its child (it dies with it). The launcher
still starts each worker as `python -m trainer ...`; that process (`client.py`) sees the zygote's socket
in its environment, hands its argv, environment, working directory and stdio to the zygote, and stays
as the worker's stand-in for the launcher: it forwards signals to the forked worker and exits with the
worker's status. A lifeline pipe ties the worker to the stand-in: if the launcher kills the stand-in,
the worker dies with it. Without the zygote (not started, or dead) the worker starts cold, as before.

Before it serves, the zygote forks one more process: multiprocessing's fork server, from which a forked
worker's NVRx helpers start with the modules loaded instead of spawning fresh interpreters that import
torch again (trainer/checkpoint/helper_server.py).

The zygote only imports; it runs no DTensor code before forking. A warm-up that built the model once
under a fake process group was tried and dropped: with the imports preloaded it saved 0.05 s per worker,
and on a mesh equal to the workers' it was wrong: the workers' first checkpoint failed DCP's plan
validation (the ranks' shards did not cover the tensors). DTensor caches state per mesh, and what the
zygote cached evidently kept rank 0's view.
"""

from __future__ import annotations

import os

SOCKET_ENV = "TRAINER_PREFORK_SOCKET"
"""Path of the zygote's Unix socket, set by the wrapper for the launcher and its workers."""

PID_ENV = "TRAINER_PREFORK_PID"
"""The zygote's PID: a worker waits for the socket only while that process lives."""

PID_FILE_SUFFIX = ".pid"
"""`<socket>.pid`: the PID of the pod's current zygote, rewritten when the launcher starts a fresh one
(PID_ENV names the first one): a worker started while the new zygote imports waits for its fork instead
of importing the same modules cold beside it."""

_launcher_pid: int | None = None  # set in a forked worker: its stand-in's parent


def launcher_pid() -> int:
    """The launcher agent that started this worker: the parent of a cold worker, the parent of the
    stand-in of a forked one (whose own parent is the zygote)."""
    return _launcher_pid if _launcher_pid is not None else os.getppid()


def forked() -> bool:
    """Whether this process is a worker the zygote forked (a warm start)."""
    return _launcher_pid is not None
