"""A completed rank's NVRx worker ends on the DONE it is sent, not by the kill after a bounded join.

The rank's exit closes the shared worker from a multiprocessing finalizer (trainer/checkpoint/backends.py):
a DONE request, then a join of at most 5 s, then a kill. The request queue's own finalizer ends its feeder
thread; when it ran first, the DONE stayed in the buffer, never sent, and every completed rank waited out
the whole 5 s (every run of the suite, every completed pod) before it killed a worker that was only idle.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

from tests.helpers import REPO_ROOT, free_port

CLOSE_JOIN_S = 30.0

SCRIPT = textwrap.dedent(
    """
    import multiprocessing.util
    import os
    import sys
    import time

    import torch.distributed as dist

    from trainer.checkpoint import nvrx_async
    from trainer.checkpoint import backends
    from trainer.checkpoint.backends import NvrxBackend

    from trainer.checkpoint import helper_server

    helper_server.start_here()  # as a rank starts its run: the worker is forked, not spawned (quicker)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[1])
    dist.init_process_group("gloo", rank=0, world_size=1)  # NVRx's worker start asks for the rank
    # Room for a worker at nice 10 on busy cores (a suite beside it) to end on its DONE; without the DONE
    # the exit waits all of it and kills the worker.
    backends.CLOSE_JOIN_S = float(sys.argv[2])
    backend = NvrxBackend(write_timeout_s=120)
    NvrxBackend._prewarm.join(120)
    worker = nvrx_async.worker_process(NvrxBackend._queue)
    deadline = time.monotonic() + 120
    while not worker.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    # A later finalizer than the close (a lower priority): how the worker ended.
    multiprocessing.util.Finalize(
        None, lambda: print("worker exit", worker.exitcode, flush=True), exitpriority=1
    )
    print("exiting", flush=True)
    """
)


def test_a_completed_process_ends_its_idle_worker_with_done_at_once() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, str(free_port()), str(CLOSE_JOIN_S)],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    out = proc.stdout.readline() if proc.stdout else ""
    assert out.strip() == "exiting", proc.communicate(timeout=60)
    started = time.monotonic()
    rest, err = proc.communicate(timeout=120)
    exit_s = time.monotonic() - started
    assert proc.returncode == 0, err[-3000:]
    assert "worker exit 0" in rest, f"the worker was killed, not ended by DONE: {rest!r}\n{err[-2000:]}"
    # An exit that took the whole join waited for a DONE that never came.
    assert exit_s < CLOSE_JOIN_S, f"the process took {exit_s:.1f} s to exit"
