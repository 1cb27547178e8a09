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

import multiprocessing.util
import threading
import time
from pathlib import Path
from typing import Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import CheckpointException, FileSystemWriter

from trainer.checkpoint.state import Stager


class CheckpointWriteError(RuntimeError):
    """A checkpoint could not be written (the background writer failed, died or timed out)."""


class SyncBackend:
    """dcp.save: the loop waits for the whole write."""

    defers_metadata = False

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
    """dcp.async_save with torch's default stager and a background thread."""

    def start(self, sd: dict[str, Any], tmp: Path, pg: dist.ProcessGroup) -> Any:
        try:
            response = dcp.async_save(
                sd, storage_writer=FileSystemWriter(tmp, sync_files=True), process_group=pg
            )
        except Exception as exc:
            raise CheckpointWriteError(f"dcp.async_save failed to start: {exc}") from exc
        # A stager that returns a future makes async_save return an AsyncSaveResponse instead of a Future.
        return getattr(response, "upload_completion", response)

    def done(self, token: Any) -> bool:
        if not token.done():
            return False
        exc = token.exception()
        if exc is not None:
            raise CheckpointWriteError(f"background dcp.async_save failed: {exc}") from exc
        return True


class NvrxBackend:
    """NVRx FileSystemWriterAsync + AsyncCallsQueue with a persistent worker process.

    The queue (and so the worker) is shared by every manager of this process: after an in-process
    restart the new manager reuses the warm worker instead of paying its start-up again.
    """

    defers_metadata = True
    _queue: Any = None
    _prewarm: threading.Thread | None = None
    _lock = threading.Lock()

    def __init__(self, write_timeout_s: float) -> None:
        self.write_timeout_s = write_timeout_s
        self.stager = Stager()
        self._queue_in_use = self._shared_queue()

    @classmethod
    def _shared_queue(cls) -> Any:
        from trainer.resilience import compat

        with cls._lock:
            if cls._queue is not None and not compat.worker_alive(cls._queue):
                compat.abort_queue(cls._queue)
                cls._queue = None
            if cls._queue is None:
                cls._queue = compat.make_async_queue()
                # In a thread: starting the write-results Manager waits for a spawned interpreter to
                # import the main module (seconds under `python -m trainer`), which restarts must not pay.
                cls._prewarm = threading.Thread(
                    target=compat.prewarm, args=(cls._queue,), name="nvrx-prewarm", daemon=True
                )
                cls._prewarm.start()
                # Not atexit: multiprocessing joins live non-daemon children (NVRx 0.4.1's worker is one)
                # before atexit handlers run, and in a multiprocessing child it never runs them at all.
                # Its finalizers with a priority run before that join.
                multiprocessing.util.Finalize(None, _close_shared_queue, exitpriority=10)
            return cls._queue

    @classmethod
    def reset_shared_queue(cls) -> None:
        """Kill the shared worker (after a failure); the next manager starts a fresh one."""
        from trainer.resilience import compat

        with cls._lock:
            if cls._queue is not None:
                compat.abort_queue(cls._queue)
                cls._queue = None

    def start(self, sd: dict[str, Any], tmp: Path, pg: dist.ProcessGroup) -> Any:
        from nvidia_resiliency_ext.checkpointing.async_ckpt.core import AsyncRequest
        from nvidia_resiliency_ext.checkpointing.async_ckpt.filesystem_async import FileSystemWriterAsync
        from nvidia_resiliency_ext.checkpointing.async_ckpt.state_dict_saver import save_state_dict_async_plan
        from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

        from trainer.resilience import compat

        prewarm = NvrxBackend._prewarm
        if prewarm is not None and prewarm.is_alive():
            prewarm.join(self.write_timeout_s)
            if prewarm.is_alive():
                raise CheckpointWriteError(f"NVRx worker did not start within {self.write_timeout_s} s")
        staged = self.stager.stage(sd)  # the copy out of device memory: the loop waits only for this...
        writer = FileSystemWriterAsync(tmp, thread_count=1)
        writer, metadata, _ = save_state_dict_async_plan(  # ...and for planning (a small collective)
            staged, writer, process_group=pg, coordinator_rank=0, planner=DefaultSavePlanner()
        )
        save_fn, preload_fn, save_args = writer.get_save_function_and_args()
        if save_fn is None:
            return (None, writer, metadata)
        request = AsyncRequest(save_fn, save_args, [], preload_fn=compat.cpu_safe_preload(preload_fn))
        queue = self._queue_in_use
        index = self._bounded(lambda: queue.schedule_async_request(request), "hand the save to the worker")
        return (index, writer, metadata)

    def _bounded(self, fn: Any, what: str) -> Any:
        """Run fn in a helper thread; give up if the worker dies or the write timeout passes.

        NVRx's schedule waits (unbounded) for the worker to acknowledge the request; a dead worker would
        block the loop forever.
        """
        from trainer.resilience import compat

        box: dict[str, Any] = {}

        def run() -> None:
            try:
                box["value"] = fn()
            except BaseException as exc:
                box["error"] = exc

        thread = threading.Thread(target=run, name="nvrx-schedule", daemon=True)
        thread.start()
        deadline = time.monotonic() + self.write_timeout_s
        while thread.is_alive():
            thread.join(0.02)
            if thread.is_alive() and not compat.worker_alive(self._queue_in_use):
                raise CheckpointWriteError(
                    f"NVRx checkpoint worker died (exit code {compat.worker_exitcode(self._queue_in_use)}) "
                    f"while trying to {what}"
                )
            if time.monotonic() > deadline:
                raise CheckpointWriteError(f"timed out after {self.write_timeout_s} s trying to {what}")
        if "error" in box:
            raise CheckpointWriteError(f"failed to {what}: {box['error']}") from box["error"]
        return box.get("value")

    def done(self, token: Any) -> bool:
        from trainer.resilience import compat

        if token[0] is None:
            return True
        # At most one save is in flight and it was scheduled last, so it is done when nothing is pending.
        if compat.poll_pending(self._queue_in_use) == 0:
            return True
        if not compat.worker_alive(self._queue_in_use):
            raise CheckpointWriteError(
                f"NVRx checkpoint worker died (exit code {compat.worker_exitcode(self._queue_in_use)}) "
                "before finishing the write"
            )
        return False

    def results(self, token: Any) -> Any:
        from trainer.resilience import compat

        if token[0] is None:
            return []
        try:
            return compat.write_results_or_raise(token[1])
        except RuntimeError as exc:
            raise CheckpointWriteError(str(exc)) from exc

    def finish(self, token: Any, gathered: list[Any]) -> None:
        """Rank 0: write the DCP .metadata from every rank's write results."""
        _, writer, metadata = token
        writer.finish(metadata, gathered)

    def abort(self) -> None:
        self.reset_shared_queue()
        self.stager.release()

    def close(self, timeout_s: float) -> None:
        self.stager.release()


def _close_shared_queue() -> None:
    from trainer.resilience import compat

    queue = NvrxBackend._queue
    if queue is not None:
        compat.close_queue(queue, timeout_s=5.0)
        NvrxBackend._queue = None


def make_backend(mode: str, write_timeout_s: float) -> Any:
    if mode == "sync":
        return SyncBackend()
    if mode == "torch-async":
        return TorchAsyncBackend()
    if mode == "nvrx":
        return NvrxBackend(write_timeout_s)
    raise ValueError(f"mode: unknown checkpoint mode {mode!r}")
