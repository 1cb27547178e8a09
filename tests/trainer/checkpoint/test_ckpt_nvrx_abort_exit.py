"""A process that aborted an NVRx checkpoint worker still exits.

NVRx's persistent worker reads its requests from multiprocessing queues. When the worker is killed with a
request still buffered, the queue's feeder thread blocks on a full pipe that nobody reads, and Python's
exit joins that thread: a trainer that completed after a tier-1 abort stayed alive (seen in a full suite:
90 minutes after its run_end). nvrx_async.abort_queue must release those queues.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.helpers import REPO_ROOT

# A stand-in for AsyncCallsQueue whose worker died: the same attributes abort_queue reads, real queues.
SCRIPT = textwrap.dedent(
    """
    import multiprocessing as mp
    import sys
    from types import SimpleNamespace

    from trainer.checkpoint import nvrx_async

    caller = SimpleNamespace(process=None, queue=mp.JoinableQueue(), preload_q=mp.JoinableQueue(),
                             comp_q=mp.Queue())
    caller.queue.put(b"x" * (4 << 20))  # more than a pipe holds: the feeder thread blocks in write()
    queue = SimpleNamespace(persistent_caller=caller, async_calls=[])
    if sys.argv[1] == "abort":
        nvrx_async.abort_queue(queue)
    print("done", flush=True)
    """
)


def _exit_within(arg: str, timeout_s: float) -> bool:
    proc = subprocess.Popen([sys.executable, "-c", SCRIPT, arg], cwd=REPO_ROOT, stdout=subprocess.PIPE)
    try:
        out, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return False
    assert out.strip() == b"done" and proc.returncode == 0
    return True


def test_the_process_exits_after_aborting_a_worker_with_a_request_in_flight() -> None:
    assert _exit_within("abort", timeout_s=30)


def test_without_the_abort_the_same_process_hangs_at_exit() -> None:
    # The control: proves the scenario above is the one that hangs (so the test above can fail).
    assert not _exit_within("keep", timeout_s=5)
