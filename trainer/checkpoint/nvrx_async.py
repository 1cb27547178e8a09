"""NVRx's asynchronous checkpointing (`nvidia_resiliency_ext.checkpointing.async_ckpt`) as the nvrx
checkpoint backend (backends.py) uses it: CPU-only hosts and the 0.4.1 / 0.7.x API drift, in one place.
Upstream report: docs/nvrx-async-ckpt.md; the canary tests that fail once the installed NVRx no longer
needs a workaround: tests/trainer/checkpoint/test_ckpt_nvrx_async.py.

NVRx's asynchronous checkpointing assumes CUDA in a few places. On a host where CUDA is available every
function here is a pass-through (or adds nothing), so the GPU path is NVRx as shipped. On a CPU-only host
(tests, the local demo) it bridges:

1. 0.4.1 `FileSystemWriterAsync.preload_tensors(..., non_blocking=True)` calls `torch.cuda.synchronize()`
   unconditionally. It runs in the persistent worker; the worker dies and the trainer blocks forever in
   `preload_q.join()`. -> `cpu_safe_preload` rebinds the preload with non_blocking=False (0.7.x syncs
   only for CUDA tensors, so this is harmless there).
2. 0.7.x's persistent worker starts with `torch.cuda.set_device(rank % torch.cuda.device_count())`
   (ZeroDivisionError on CPU) unless the queue is built with `cpu_shm_mode=True`, a keyword 0.4.1 lacks.
   -> `make_async_queue` passes it only when the installed NVRx accepts it and CUDA is absent.
3. `AsyncCallsQueue.maybe_finalize_async_calls(no_dist=False)` agrees across ranks with an all_reduce on a
   CUDA tensor (both versions). -> `poll_finished` always uses no_dist=True; the checkpoint manager does
   the cross-rank agreement itself on its gloo group.
4. A worker that dies (any version) never reports completion, and NVRx's blocking wait polls forever.
   -> `worker_alive` exposes the worker process so callers can bound every wait; `abort_queue` kills it.
5. `FileSystemWriterAsync.retrieve_write_results()` raises on a failed write in 0.4.1 and returns a
   wrapped exception in 0.7.x. -> `write_results_or_raise` turns both into one RuntimeError.
6. 0.4.1 starts the worker lazily on the first save (~3-4 s of imports in the first save's blocked time);
   0.7.x has `warmup_persistent_caller`. -> `prewarm` starts it with a no-op request on both, and has
   the write-results Manager unpickle one DCP result meanwhile (`warm_results_manager`): the first
   save's results made it import DCP inside that save (1.2-1.4 s on a quiet host).
7. `maybe_finalize_async_calls` returns the `call_idx` field of the stored request, which is never set
   (always 0) in both versions. -> `poll_pending` returns how many calls are still unfinished instead.
8. When the trainer is SIGKILLed (tier-2 faults do exactly that), the worker, its forked writers and the
   write-results Manager live on as orphans, blocked forever. -> the warm-up request installs a watchdog
   thread in the worker that kills all of them once the trainer is gone, and `abort_queue` kills the
   worker's writers with it. (Not CPU-specific.)
9. Every writer of a process puts its write results into one module-global queue
   (`filesystem_async._results_queue`), and `retrieve_write_results` takes whatever comes first. A save
   that was abandoned (aborted by a fault, a manager closed before its finalize) leaves its result
   there, and the next save took it: a committed, signed checkpoint whose .metadata named the other
   save's offsets, which no restore could read (seen in the test suite: every tensor read at a 64-byte
   shift). -> `drain_stale_results` before each save is handed to the worker, and
   `write_results_or_raise` checks that the results tile the files this save wrote before anything is
   committed. (Not CPU-specific.)
10. `schedule_async_request` returns once a request is queued, before the spawned worker has imported
   torch: a warm-up leaves the worker's start-up to the first save. -> `prewarm` waits until the warm-up
   call has finished (NvrxBackend.worker_ready).
11. Both helpers (the persistent worker, the write-results Manager) are started with a hard-coded
   `spawn`: two fresh interpreters importing torch per rank process, at every start and restart. ->
   `use_helper_server` has NVRx's `spawn` start them from the pod's fork server instead, where the
   prefork zygote started one (helper_server.py); elsewhere they are spawned as shipped. (Not
   CPU-specific.)

Only these NVRx names are used, all present in 0.4.1 and 0.7.0: AsyncCallsQueue(persistent=...),
.schedule_async_request, .maybe_finalize_async_calls(blocking, no_dist), .get_num_unfinalized_calls,
.persistent_caller.process, AsyncRequest(async_fn, async_fn_args, finalize_fns, preload_fn=...),
FileSystemWriterAsync(path, thread_count=...), .get_save_function_and_args, .retrieve_write_results,
.finish, save_state_dict_async_plan(state_dict, writer, process_group, coordinator_rank, planner).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
import os
import select
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import torch

from trainer.checkpoint import helper_server

log = logging.getLogger(__name__)


def cuda_available() -> bool:
    return torch.cuda.is_available()


def make_async_queue() -> Any:
    """A persistent-worker AsyncCallsQueue that can start its worker on this host."""
    from nvidia_resiliency_ext.checkpointing.async_ckpt.core import AsyncCallsQueue

    use_helper_server()
    kwargs: dict[str, Any] = {"persistent": True}
    params = inspect.signature(AsyncCallsQueue.__init__).parameters
    if not cuda_available() and "cpu_shm_mode" in params:
        kwargs["cpu_shm_mode"] = True  # 0.7.x: skip the worker's CUDA device selection
    if cuda_available():
        return AsyncCallsQueue(**kwargs)
    return _cpu_queue_class(AsyncCallsQueue)(**kwargs)


class _HelperStarts:
    """An NVRx module's `torch.multiprocessing`, whose `get_context("spawn")` is the pod's fork server
    (helper_server.context()) while there is one; everything else is the module's own."""

    def __init__(self, mp: Any) -> None:
        self._mp = mp

    def get_context(self, method: str | None = None) -> Any:
        if method == "spawn" and (forked := helper_server.context()) is not None:
            return forked
        return self._mp.get_context(method)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._mp, name)


def use_helper_server() -> None:
    """Have NVRx start its helpers from the pod's fork server while there is one (item 11)."""
    from nvidia_resiliency_ext.checkpointing.async_ckpt import core, filesystem_async

    for module in (core, filesystem_async):
        if not isinstance(module.mp, _HelperStarts):
            module.mp = _HelperStarts(module.mp)


@functools.cache
def _cpu_queue_class(base: type) -> type:
    """AsyncCallsQueue whose garbage collection cannot raise on a CPU host: NVRx's `__del__` closes the
    queue, finalizing pending calls, and the finalization's all_reduce asks for
    `torch.cuda.current_device()` (seen: an unraisable AssertionError when a dropped queue was collected
    during a later test). Collected, a CPU queue is aborted instead: whatever it was writing is an
    uncommitted temp dir, never loaded (as abort_queue)."""

    class CpuAsyncCallsQueue(base):
        def __del__(self) -> None:
            with contextlib.suppress(Exception):
                abort_queue(self)
                self.close(abort=True)

    return CpuAsyncCallsQueue


def cpu_safe_preload(preload_fn: Callable[[], Any] | None) -> Callable[[], Any] | None:
    """The writer's preload function, rebound to non_blocking=False when there is no CUDA."""
    if preload_fn is None or cuda_available():
        return preload_fn
    if isinstance(preload_fn, functools.partial) and preload_fn.args and preload_fn.args[-1] is True:
        return functools.partial(preload_fn.func, *preload_fn.args[:-1], False, **preload_fn.keywords)
    return preload_fn


def poll_pending(queue: Any) -> int:
    """Finalize the calls this rank's worker has finished (no cross-rank agreement, no CUDA); returns
    how many are still unfinished."""
    queue.maybe_finalize_async_calls(blocking=False, no_dist=True)
    return int(queue.get_num_unfinalized_calls())


def worker_process(queue: Any) -> Any:
    caller = getattr(queue, "persistent_caller", None)
    return getattr(caller, "process", None)


def worker_alive(queue: Any) -> bool:
    """False when the persistent worker was started and is gone (crashed, killed)."""
    proc = worker_process(queue)
    return proc is None or proc.is_alive()


def worker_exitcode(queue: Any) -> int | None:
    proc = worker_process(queue)
    return None if proc is None else proc.exitcode


def abort_queue(queue: Any, timeout_s: float = 1.0) -> None:
    """Kill the persistent worker now, without NVRx's unbounded joins; drop pending calls.

    SIGKILL, not SIGTERM: the worker inherits the signal mask of the thread that started it, and with
    SIGTERM blocked there (seen under the in-process Wrapper) a SIGTERM waits forever. Whatever it was
    writing is an uncommitted temp dir, never loaded.
    """
    proc = worker_process(queue)
    if proc is not None and proc.is_alive():
        # 0.4.1's worker forks one writer process per file; orphaned, those block forever on queues.
        for child in helper_server.descendants(proc.pid):
            with contextlib.suppress(OSError):
                os.kill(child, signal.SIGKILL)
        proc.kill()
        proc.join(timeout_s)
    caller = getattr(queue, "persistent_caller", None)
    if caller is not None:
        caller.process = None  # so NVRx's __del__/close do not join a dead worker's queues
        # A request still buffered for the dead worker keeps its queue's feeder thread blocked on a full
        # pipe nobody reads; multiprocessing joins that thread at interpreter exit, so a trainer that
        # completed after an abort would never exit (its MainThread in Queue._finalize_join). Nothing on
        # these queues is needed once the worker is gone.
        for name in ("queue", "preload_q", "comp_q"):
            q = getattr(caller, name, None)
            if q is not None and hasattr(q, "cancel_join_thread"):
                q.cancel_join_thread()
    if hasattr(queue, "async_calls"):
        queue.async_calls.clear()


def close_queue(queue: Any, timeout_s: float) -> None:
    """Stop an idle worker politely (DONE message), bounded; fall back to abort_queue."""
    proc = worker_process(queue)
    if proc is not None and proc.is_alive():
        with contextlib.suppress(Exception):  # the queue may be broken already
            queue.persistent_caller.queue.put("DONE")
        proc.join(timeout_s)
    abort_queue(queue)


def write_results_or_raise(writer: Any) -> list[Any]:
    """The write results of a finished FileSystemWriterAsync, or RuntimeError if the write failed or
    the results do not describe the files this save wrote (item 9)."""
    from torch.distributed.checkpoint.utils import _is_wrapped_exception

    results = writer.retrieve_write_results()  # 0.4.1 raises here on failure
    if _is_wrapped_exception(results):  # 0.7.x returns (exception, traceback)
        raise RuntimeError(f"checkpoint worker failed: {results[0]}") from results[0]
    results = list(results)
    directory = getattr(writer, "checkpoint_dir", None) or getattr(writer, "path", None)
    mismatch = results_mismatch(results, directory) if directory is not None else None
    if mismatch:
        raise RuntimeError(
            f"checkpoint write results do not describe the files written ({mismatch}): results of "
            "another save (NVRx's per-process results queue); this save is not committed"
        )
    return results


def drain_stale_results() -> int:
    """Discard what waits in NVRx's per-process write-results queue; how many were dropped (item 9).
    Called just before a save is handed to the worker: this process has no other save in flight then,
    so anything queued belongs to an earlier, abandoned save."""
    import queue

    from nvidia_resiliency_ext.checkpointing.async_ckpt import filesystem_async

    shared = getattr(filesystem_async, "_results_queue", None)
    dropped = 0
    while shared is not None:
        try:
            shared.get_nowait()
        except queue.Empty:
            break
        except Exception:  # the Manager is gone (its worker was killed): nothing left to drain
            break
        dropped += 1
    if dropped:
        log.warning("dropped %d stale checkpoint write result(s) of an abandoned save", dropped)
    return dropped


def results_mismatch(results: list[Any], checkpoint_dir: Any) -> str | None:
    """Why `results` cannot be this save's (None: they can). DCP's write results name, per item, the
    file, offset and length it was written at; items of one save tile each data file from 0 to its end.
    Results of another save of a state with the same keys name the same files at other offsets."""
    spans: dict[str, list[tuple[int, int]]] = {}
    for result in results:
        info = result.storage_data
        spans.setdefault(str(info.relative_path), []).append((int(info.offset), int(info.length)))
    for name, items in spans.items():
        path = os.path.join(os.fspath(checkpoint_dir), name)
        try:
            size = os.path.getsize(path)
        except OSError:
            return f"{name} is missing"
        end = 0
        for offset, length in sorted(items):
            if offset != end:
                return f"{name}: an item at byte {offset}, the previous one ends at {end}"
            end = offset + length
        if end != size:
            return f"{name}: the items end at byte {end}, the file has {size}"
    return None


class _AfterFork:
    """Anchor for multiprocessing's after-fork hook (it holds its owner weakly)."""


_AFTER_FORK = _AfterFork()


def _die_with_parent(_: object) -> None:
    """In a process forked by the worker (0.4.1's per-file writers): get SIGKILL when the worker dies."""
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0)


def _watch_trainer(trainer_pid: int, also_kill: list[int]) -> None:
    """Runs in the worker (the warm-up request's target): exit, taking `also_kill` along, once the
    trainer process is gone; writers the worker forks die with it. Importable by name, so the spawned
    worker can unpickle it. (Not PR_SET_PDEATHSIG for the worker itself: it fires when the *thread* that
    started the worker ends, and a short-lived thread starts it; and a worker from the pod's fork server
    is not the trainer's child at all.)"""
    import multiprocessing.util

    multiprocessing.util.register_after_fork(_AFTER_FORK, _die_with_parent)
    wait_for_exit = _exit_waiter(trainer_pid)

    def watch() -> None:
        wait_for_exit()
        for pid in [*helper_server.descendants(os.getpid()), *also_kill]:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        os._exit(1)

    threading.Thread(target=watch, name="trainer-watchdog", daemon=True).start()
    # What the first save's request unpickles and runs, imported now (seconds on a loaded host), while
    # the trainer still writes its saves with the fallback (NvrxBackend.worker_ready).
    import nvidia_resiliency_ext.checkpointing.async_ckpt.filesystem_async  # noqa: F401
    import torch.distributed.checkpoint  # noqa: F401


def _exit_waiter(pid: int) -> Callable[[], None]:
    """A function that returns once process `pid` has exited. Made while it certainly runs (the trainer
    waits for the warm-up request): a pidfd refers to that process, never to a later one with its PID.
    Without pidfds (Linux < 5.3), polled: the trainer is the spawned worker's parent."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return lambda: None
    except (AttributeError, OSError):

        def poll_parent() -> None:
            while os.getppid() == pid:
                time.sleep(0.5)

        return poll_parent

    def wait_readable() -> None:
        select.select([pidfd], [], [])

    return wait_readable


PREWARM_POLL_S = 0.05
"""How often the warm-up looks whether the worker has run its first request."""


WORKER_START_NICE = 9
"""The persistent worker's nice value from its spawn on. NVRx lowers its own priority to 10 once it is up
(`_set_process_qos`, a relative step that warns when there is none to take, hence 9, not 10); until
then the spawned interpreter imports torch at the trainer's priority."""


def yield_to_training(pid: int, nice: int) -> None:
    """Lower a helper process's CPU priority to `nice` (never raise it).

    NVRx's worker is a spawned interpreter: it imports torch (about 2 s of CPU) when a trainer process
    starts, which is a run's start-up or a restart's restore. At the trainer's priority, on a node whose
    cores the ranks keep busy, that import is taken from the restore it runs beside.

    Not the write-results Manager: a trainer that exits waits for the Manager's reply to its shutdown,
    and at nice 19 on a loaded host its torch import (the warm-up's) starved for over 120 s, so a rank
    that gave up at start-up did not exit (seen in a fresh-clone `make test`)."""
    try:
        if os.getpriority(os.PRIO_PROCESS, pid) < nice:
            os.setpriority(os.PRIO_PROCESS, pid, nice)
    except OSError as exc:  # gone already, or not ours: a head start lost, nothing else
        log.debug("could not lower the priority of %d: %s", pid, exc)


def warm_results_manager(results_queue: Any) -> None:
    """Have the write-results Manager import what a save's results need, now rather than in a save.

    The Manager is a spawned server process that unpickles every item put into its queue. The first
    save's write results are DCP `WriteResult`s, and unpickling them imports torch there: the worker's
    `put` waits about a second for it even on a quiet host, the first save's commit much longer on
    loaded cores, and the next save blocks the loop waiting for it (docs/history.md). One result of the
    same classes, put and taken back, pays that at start-up. Nothing else uses the queue meanwhile: no
    save of this process is handed to the worker until the warm-up thread is done
    (NvrxBackend.worker_ready)."""
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import MetadataIndex
    from torch.distributed.checkpoint.storage import WriteResult

    result = WriteResult(MetadataIndex("warm-up"), size_in_bytes=0, storage_data=_StorageInfo("-", 0, 0))
    results_queue.put({0: [result]})
    results_queue.get()


def prewarm(queue: Any) -> None:
    """Start the persistent worker (and the write-results Manager) now instead of inside the first save;
    the worker watches the trainer and cleans up if it dies."""
    from nvidia_resiliency_ext.checkpointing.async_ckpt import filesystem_async
    from nvidia_resiliency_ext.checkpointing.async_ckpt.core import AsyncRequest

    # The write-results queue is a multiprocessing Manager (a spawned server process), created lazily in
    # the first save's planning. Named differently in 0.4.1 and 0.7.x.
    getter = getattr(filesystem_async, "get_write_results_queue", None) or getattr(
        filesystem_async, "_get_write_results_queue", None
    )
    manager_pids: list[int] = []
    try:
        if getter is not None:
            results_queue = getter()
            process = getattr(getattr(results_queue, "_manager", None), "_process", None)
            if process is not None and process.pid:
                manager_pids.append(int(process.pid))
        queue.schedule_async_request(AsyncRequest(_watch_trainer, (os.getpid(), manager_pids), []))
        worker = worker_process(queue)
        if worker is not None and worker.pid:
            yield_to_training(int(worker.pid), WORKER_START_NICE)
        if getter is not None:  # while the worker starts
            warm_results_manager(results_queue)
        # The request is handed over before the spawned worker has even imported torch (0.16 s here, of a
        # start-up of 6.5 s on a quiet host and 20-40 s on a loaded one): the worker is up, and a save
        # handed to it is not queued behind its start-up, once it has run the request. Nobody else uses
        # the queue meanwhile: a direct save waits for this thread (wait_for_worker), a save from a
        # snapshot is written by the fallback while it runs (NvrxBackend.worker_ready).
        while poll_pending(queue) > 0 and worker_alive(queue):
            time.sleep(PREWARM_POLL_S)
    except Exception as exc:
        # Only a head start: the first save starts the worker anyway. A run that ends (or gives up on an
        # unrecoverable error) at once tears the process group down under this thread, and NVRx asks it
        # for the rank, or exits while the Manager's handshake is under way (seen in `make test`: the
        # handshake in `get_write_results_queue` broke off as a rank gave up at step 0; the log lost
        # the exception's last line): a one-line note, not a traceback.
        log.info("NVRx worker not started ahead of the first save: %s", exc)
