"""Canaries of trainer/checkpoint/nvrx_async.py (docs/nvrx-async-ckpt.md): each test shows the installed
NVRx still doing what a workaround bridges, and fails once NVRx fixes it (then drop the workaround and
its item in the report). What the workarounds achieve is tested with real saves in test_ckpt_one_rank.py,
test_ckpt_safety.py and test_ckpt_nvrx_abort_exit.py.

Cheap: no worker process is started. Where the behaviour needs CUDA or a dying process to show, the test
reads the installed NVRx's source of the one function concerned.
"""

from __future__ import annotations

import inspect
from typing import Any

from nvidia_resiliency_ext.checkpointing.async_ckpt import core


def test_item_2_the_persistent_worker_selects_a_cuda_device_unless_cpu_shm_mode() -> None:
    """Without `cpu_shm_mode` the worker divides by torch.cuda.device_count(): ZeroDivisionError on CPU."""
    assert "cpu_shm_mode" in inspect.signature(core.AsyncCallsQueue.__init__).parameters
    source = inspect.getsource(core.PersistentAsyncCaller.async_process_target)
    assert "rank % torch.cuda.device_count()" in source
    assert "is_available" not in source  # NVRx does not fall back to CPU by itself


def test_item_3_cross_rank_agreement_uses_a_cuda_tensor() -> None:
    """`maybe_finalize_async_calls(no_dist=False)` agrees across ranks with an all_reduce on the current
    CUDA device, so the manager polls with no_dist=True and agrees on its own gloo group."""
    source = inspect.getsource(core.AsyncCaller.sync_all_async_calls)
    assert "device=torch.cuda.current_device()" in source


def test_item_4_a_blocking_wait_never_asks_whether_the_worker_lives() -> None:
    """A dead worker never reports completion and the blocking wait polls its queue forever."""
    source = inspect.getsource(core.PersistentAsyncCaller.is_current_async_call_done)
    assert "sleep(0.1)" in source
    assert "is_alive()" not in source


class _DoneCaller:
    """An async caller whose every call is already done (no worker process)."""

    def schedule_async_call(self, request: Any) -> None:
        pass

    def is_current_async_call_done(self, blocking: bool = False, no_dist: bool = False) -> bool:
        return True


def test_item_7_finalized_calls_report_index_0_whatever_their_index() -> None:
    """Two calls are scheduled as 0 and 1, and finalizing them reports [0] twice: the stored request's
    call_idx is never set, so `poll_pending` counts unfinished calls instead."""
    queue = core.AsyncCallsQueue(persistent=False)
    queue._get_async_caller = _DoneCaller  # type: ignore[method-assign]
    indices = [queue.schedule_async_request(core.AsyncRequest(print, (), [])) for _ in range(2)]
    assert indices == [0, 1]
    assert queue.maybe_finalize_async_calls(blocking=False, no_dist=True) == [0, 0]
    assert queue.get_num_unfinalized_calls() == 0


def test_item_8_nothing_in_the_worker_watches_the_trainer() -> None:
    """A SIGKILLed trainer leaves its worker (and 0.4.1's writers) orphaned: no parent watch, no
    parent-death signal anywhere in NVRx's async-checkpoint core."""
    source = inspect.getsource(core)
    assert "getppid" not in source and "prctl" not in source and "PDEATHSIG" not in source
