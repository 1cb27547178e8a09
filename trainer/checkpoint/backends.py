"""The three ways a rank writes its shard files into a checkpoint's temporary directory.

Each backend does only this rank's part: start the write (the part the loop waits for), report when the
local write is finished (or raise CheckpointWriteError), and hand over whatever rank 0 needs to write the
DCP `.metadata`. The cross-rank agreement and the commit are the manager's.

- sync:        dcp.save. Everything, including `.metadata`, is written before start() returns.
- torch-async: dcp.async_save. Staging (a CPU copy) in start(); writing, planning and `.metadata` in a
               background thread of this process, on a gloo group of its own (not the manager's
               coordination group, which the main thread uses at the same time).
- nvrx:        NVRx's FileSystemWriterAsync and persistent worker process. start() stages a CPU snapshot
               and plans (a collective); the worker writes; rank 0 writes `.metadata` at commit.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing.util
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import CheckpointException, FileSystemWriter
from torch.distributed.checkpoint.filesystem import FileSystem

from trainer.checkpoint.errors import CheckpointWriteError
from trainer.state.save_dict import Stager

log = logging.getLogger(__name__)

CLOSE_PRIORITY = 20
"""multiprocessing's exit priority of the shared NVRx worker's close: above a Queue's own (10)."""
CLOSE_JOIN_S = 5.0
"""How long a process's exit waits for its idle NVRx worker to end on the DONE it is sent, before it
kills it: the worker runs at nice 10, and an exit must not wait on it for long on busy cores."""

__all__ = ["CheckpointWriteError", "NvrxBackend", "SyncBackend", "TorchAsyncBackend", "make_backend"]


class SyncBackend:
    """dcp.save: the loop waits for the whole write."""

    defers_metadata = False
    reuses_snapshots = False
    """Whether a save may be written from the snapshot of its step (from_snapshot.py) via write_staged.
    Not sync: there the checkpoint is committed when save() returns, by definition."""

    def start(self, sd: dict[str, Any], tmp: Path, pg: dist.ProcessGroup) -> Any:
        try:
            dcp.save(sd, storage_writer=FileSystemWriter(tmp, sync_files=True), process_group=pg)
        except (Exception, CheckpointException) as exc:  # DCP's CheckpointException is a BaseException
            raise CheckpointWriteError(f"dcp.save failed: {exc}") from exc
        return None

    def done(self, token: Any) -> bool:
        return True

    def results(self, token: Any) -> Any:
        return None

    def finish(self, token: Any, gathered: list[Any]) -> None:
        """Nothing: dcp.save wrote the .metadata already."""

    def abort(self) -> None:
        """Nothing runs in the background."""

    def close(self, timeout_s: float) -> None:
        """Nothing to stop."""


class TorchAsyncBackend(SyncBackend):
    """dcp.async_save with torch's default stager and a background thread.

    A thread cannot be killed, so abort() cancels it instead: its writer's file system refuses to open
    another file or write another chunk once cancelled (the thread fails at its next write), and abort
    waits a bounded time for it to end. After abort() returns, this backend's old writer creates no file
    and issues no write; at most a single write call already inside the kernel completes.
    """

    ABORT_JOIN_S = 2.0
    """How long abort() waits for the cancelled thread (a write call already in the kernel finishes)."""

    def __init__(self) -> None:
        self._cancel: threading.Event | None = None
        self._future: Any = None

    def start(self, sd: dict[str, Any], tmp: Path, pg: dist.ProcessGroup) -> Any:
        self._cancel = threading.Event()
        writer = FileSystemWriter(tmp, sync_files=True)
        writer.fs = _CancellableFileSystem(self._cancel)
        try:
            response = dcp.async_save(sd, storage_writer=writer, process_group=pg)
        except Exception as exc:
            raise CheckpointWriteError(f"dcp.async_save failed to start: {exc}") from exc
        # A stager that returns a future makes async_save return an AsyncSaveResponse instead of a Future.
        self._future = getattr(response, "upload_completion", response)
        return self._future

    reuses_snapshots = True

    def write_staged(
        self, staged: dict[str, Any], tmp: Path, pg: dist.ProcessGroup, cancel: threading.Event
    ) -> Any:
        """Write an already staged copy (from_snapshot.py's background thread): dcp.save, in that thread,
        on its cancellable file system. Done when this returns (token None)."""
        writer = FileSystemWriter(tmp, sync_files=True)
        writer.fs = _CancellableFileSystem(cancel)
        try:
            dcp.save(staged, storage_writer=writer, process_group=pg)
        except (Exception, CheckpointException) as exc:
            raise CheckpointWriteError(f"dcp.save failed: {exc}") from exc
        return None

    def done(self, token: Any) -> bool:
        if token is None:
            return True
        if not token.done():
            return False
        exc = token.exception()
        if exc is not None:
            raise CheckpointWriteError(f"background dcp.async_save failed: {exc}") from exc
        return True

    def abort(self) -> None:
        if self._cancel is not None:
            self._cancel.set()
        future, self._future = self._future, None
        if future is not None:
            with contextlib.suppress(BaseException):  # it fails with the cancellation, by design
                future.exception(timeout=self.ABORT_JOIN_S)
            if not future.done():
                log.warning("cancelled dcp.async_save thread still running after %s s", self.ABORT_JOIN_S)


class _WriteCancelled(OSError):
    """Raised inside a cancelled writer thread."""


class _CancellableFileSystem(FileSystem):
    """DCP's local file system, refusing every open and every write once `cancel` is set."""

    def __init__(self, cancel: threading.Event) -> None:
        super().__init__()
        self.cancel = cancel

    def _check(self) -> None:
        if self.cancel.is_set():
            raise _WriteCancelled("checkpoint write cancelled (the save was aborted)")

    @contextlib.contextmanager
    def create_stream(self, path: Any, mode: str) -> Iterator[Any]:
        self._check()
        with super().create_stream(path, mode) as stream:
            yield _CancellableStream(stream, self._check) if "w" in mode else stream

    def rename(self, path: Any, new_path: Any) -> None:
        self._check()
        super().rename(path, new_path)


class _CancellableStream:
    """A file object whose write() checks for cancellation first (torch.save writes in chunks)."""

    def __init__(self, stream: Any, check: Any) -> None:
        self._stream, self._check = stream, check

    def write(self, data: Any) -> int:
        self._check()
        return int(self._stream.write(data))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)

    def __enter__(self) -> _CancellableStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self._stream.close()


class NvrxBackend:
    """NVRx FileSystemWriterAsync + AsyncCallsQueue with a persistent worker process.

    The queue (and so the worker) is shared by every manager of this process: after an in-process
    restart the new manager reuses the warm worker instead of paying its start-up again.
    """

    defers_metadata = True
    reuses_snapshots = True
    _queue: Any = None
    _prewarm: threading.Thread | None = None
    _lock = threading.Lock()

    def __init__(
        self, write_timeout_s: float, progress: Callable[[], None] | None = None, *, start_worker: bool = True
    ) -> None:
        """`start_worker` False: the worker starts at `start_worker()` (or the first save that needs it),
        not now."""
        self.write_timeout_s = write_timeout_s
        self.progress = progress
        """Called while start() waits for the worker (a cold start takes seconds to a minute on a loaded
        host): the in-process Wrapper must not take that wait, bounded by write_timeout_s, for a hang,
        or every restart kills the starting worker and the next first save waits for a new one."""
        self.stager = Stager()
        self._queue_in_use = self._shared_queue() if start_worker else None

    def start_worker(self) -> None:
        """Start the shared worker (its warm-up runs in a thread) unless this backend has one."""
        if self._queue_in_use is None:
            self._queue_in_use = self._shared_queue()

    @classmethod
    def _shared_queue(cls) -> Any:
        from trainer.checkpoint import nvrx_async

        with cls._lock:
            if cls._queue is not None and not nvrx_async.worker_alive(cls._queue):
                nvrx_async.abort_queue(cls._queue)
                cls._queue = None
            if cls._queue is None:
                cls._queue = nvrx_async.make_async_queue()
                # In a thread: starting the write-results Manager waits for a spawned interpreter to
                # import the main module (seconds under `python -m trainer`), which restarts must not pay.
                cls._prewarm = threading.Thread(
                    target=nvrx_async.prewarm, args=(cls._queue,), name="nvrx-prewarm", daemon=True
                )
                cls._prewarm.start()
                # Not atexit: multiprocessing joins live non-daemon children (NVRx 0.4.1's worker is one)
                # before atexit handlers run, and in a multiprocessing child it never runs them at all.
                # Its finalizers with a priority run before that join, the highest first: above the
                # queues' own (10, which end their feeder threads: a DONE put after them was never sent,
                # and every completed rank waited out the 5 s join below, then killed the worker).
                multiprocessing.util.Finalize(None, _close_shared_queue, exitpriority=CLOSE_PRIORITY)
            return cls._queue

    @classmethod
    def reset_shared_queue(cls) -> None:
        """Kill the shared worker (after a failure); the next manager starts a fresh one."""
        from trainer.checkpoint import nvrx_async

        with cls._lock:
            if cls._queue is not None:
                nvrx_async.abort_queue(cls._queue)
                cls._queue = None

    def start(self, sd: dict[str, Any], tmp: Path, pg: dist.ProcessGroup) -> Any:
        self.wait_for_worker(self.progress)
        staged = self.stager.stage(sd)  # the copy out of device memory: the loop waits only for this...
        return self.write_staged(staged, tmp, pg, None, progress=self.progress)

    def worker_ready(self) -> bool:
        """Whether a save handed over now would not wait for the worker's start-up (never blocks)."""
        prewarm = NvrxBackend._prewarm
        queue = self._queue_in_use
        return (
            queue is not None and queue is NvrxBackend._queue and (prewarm is None or not prewarm.is_alive())
        )

    def wait_for_worker(
        self, progress: Callable[[], None] | None, cancel: threading.Event | None = None
    ) -> None:
        """Until the persistent worker has started (its warm-up request, started with the queue), bounded
        by the write timeout. `progress` is pinged meanwhile (the loop's own wait; a background writer
        passes None: its waits must not count as the loop's progress)."""
        if self._queue_in_use is None or self._queue_in_use is not NvrxBackend._queue:
            self._queue_in_use = self._shared_queue()  # the one this backend used was killed by abort()
        prewarm = NvrxBackend._prewarm
        if prewarm is not None and prewarm.is_alive():
            deadline = time.monotonic() + self.write_timeout_s
            while prewarm.is_alive() and time.monotonic() < deadline:
                prewarm.join(min(0.5, max(deadline - time.monotonic(), 0.0)))
                if progress is not None:
                    progress()
                if cancel is not None and cancel.is_set():
                    raise CheckpointWriteError("save aborted while waiting for the NVRx worker")
            if prewarm.is_alive():
                raise CheckpointWriteError(f"NVRx worker did not start within {self.write_timeout_s} s")

    def write_staged(
        self,
        staged: dict[str, Any],
        tmp: Path,
        pg: dist.ProcessGroup,
        cancel: threading.Event | None,
        progress: Callable[[], None] | None = None,
    ) -> Any:
        """Plan the save of a staged copy (in shared memory: the worker reads it) and hand it to the
        worker; the token for done/results/finish. From a background thread (from_snapshot.py) too."""
        from nvidia_resiliency_ext.checkpointing.async_ckpt.core import AsyncRequest
        from nvidia_resiliency_ext.checkpointing.async_ckpt.filesystem_async import FileSystemWriterAsync
        from nvidia_resiliency_ext.checkpointing.async_ckpt.state_dict_saver import save_state_dict_async_plan
        from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

        from trainer.checkpoint import nvrx_async

        self.wait_for_worker(progress, cancel)
        writer = FileSystemWriterAsync(tmp, thread_count=1)
        writer, metadata, _ = save_state_dict_async_plan(  # ...and for planning (a small collective)
            staged, writer, process_group=pg, coordinator_rank=0, planner=DefaultSavePlanner()
        )
        save_fn, preload_fn, save_args = writer.get_save_function_and_args()
        if save_fn is None:
            return (None, writer, metadata)
        request = AsyncRequest(save_fn, save_args, [], preload_fn=nvrx_async.cpu_safe_preload(preload_fn))
        nvrx_async.drain_stale_results()  # no save of this process is in flight: anything queued is stale
        queue = self._queue_in_use
        assert queue is not None  # wait_for_worker made it
        index = self._bounded(
            lambda: queue.schedule_async_request(request), "hand the save to the worker", progress
        )
        return (index, writer, metadata)

    def _bounded(self, fn: Any, what: str, progress: Callable[[], None] | None) -> Any:
        """Run fn in a helper thread; give up if the worker dies or the write timeout passes.

        NVRx's schedule waits (unbounded) for the worker to acknowledge the request; a dead worker would
        block the loop forever.
        """
        from trainer.checkpoint import nvrx_async

        box: dict[str, Any] = {}

        def run() -> None:
            try:
                box["value"] = fn()
            except BaseException as exc:
                box["error"] = exc

        thread = threading.Thread(target=run, name="nvrx-schedule", daemon=True)
        thread.start()
        deadline = time.monotonic() + self.write_timeout_s
        polls = 0
        while thread.is_alive():
            thread.join(0.02)
            polls += 1
            if progress is not None and polls % 25 == 0:  # every 0.5 s
                progress()
            if thread.is_alive() and not nvrx_async.worker_alive(self._queue_in_use):
                raise CheckpointWriteError(
                    "NVRx checkpoint worker died "
                    f"(exit code {nvrx_async.worker_exitcode(self._queue_in_use)}) while trying to {what}"
                )
            if time.monotonic() > deadline:
                raise CheckpointWriteError(f"timed out after {self.write_timeout_s} s trying to {what}")
        if "error" in box:
            raise CheckpointWriteError(f"failed to {what}: {box['error']}") from box["error"]
        return box.get("value")

    def done(self, token: Any) -> bool:
        from trainer.checkpoint import nvrx_async

        if token[0] is None:
            return True
        # At most one save is in flight and it was scheduled last, so it is done when nothing is pending.
        if nvrx_async.poll_pending(self._queue_in_use) == 0:
            return True
        if not nvrx_async.worker_alive(self._queue_in_use):
            raise CheckpointWriteError(
                f"NVRx checkpoint worker died (exit code {nvrx_async.worker_exitcode(self._queue_in_use)}) "
                "before finishing the write"
            )
        return False

    def results(self, token: Any) -> Any:
        from trainer.checkpoint import nvrx_async

        if token[0] is None:
            return []
        try:
            return nvrx_async.write_results_or_raise(token[1])
        except RuntimeError as exc:
            raise CheckpointWriteError(str(exc)) from exc

    def finish(self, token: Any, gathered: list[Any]) -> None:
        """Rank 0: write the DCP .metadata from every rank's write results."""
        _, writer, metadata = token
        writer.finish(metadata, gathered)

    def abort(self) -> None:
        """Kill the worker (and its writers) now; the next start() gets a fresh one."""
        self.reset_shared_queue()
        self._queue_in_use = None
        self.stager.release()

    def close(self, timeout_s: float) -> None:
        self.stager.release()


def _close_shared_queue() -> None:
    from trainer.checkpoint import nvrx_async

    queue = NvrxBackend._queue
    if queue is not None:
        nvrx_async.close_queue(queue, timeout_s=CLOSE_JOIN_S)
        NvrxBackend._queue = None


def make_backend(
    mode: str,
    write_timeout_s: float,
    progress: Callable[[], None] | None = None,
    *,
    start_worker: bool = True,
) -> Any:
    """The writer of `mode`; `start_worker` False defers starting NVRx's worker (NvrxBackend)."""
    if mode == "sync":
        return SyncBackend()
    if mode == "torch-async":
        return TorchAsyncBackend()
    if mode == "nvrx":
        return NvrxBackend(write_timeout_s, progress, start_worker=start_worker)
    raise ValueError(f"mode: unknown checkpoint mode {mode!r}")
