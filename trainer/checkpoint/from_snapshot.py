"""A durable checkpoint written from the snapshot of its step, in a background thread.

With snapshots on, the loop has just copied the state of step N into a /dev/shm slot (trainer/snapshot/)
when the save of step N is due. Copying it again from the live tensors, planning the DCP save (a
collective) and handing it to the writer would block the loop a second time (most of it planning and,
for the first save of a process, NVRx's worker start-up). Instead:

  loop thread (save()):   hold the slot (the next-but-one snapshot waits for it; it never has to),
                          note the tensors' DTensor placements from the snapshot's save dict, start the
                          thread. Nothing else: what blocks the loop is the snapshot it reuses.
  background thread:      copy the held slot into this manager's staging buffers and verify it (header:
                          this run, rank and step; payload CRC32 after the copy; header unchanged), release
                          the slot; agree with the other ranks' threads that every copy is good (one
                          all_reduce on the writer's group: a rank that failed never leaves its peers
                          in the planning collective); then the backend's `write_staged` (nvrx: plan,
                          schedule on the worker; torch-async: dcp.save) into the same directory as the
                          direct path. The commit (manifest, signature, rename, retention, drain to FSx)
                          is the manager's, unchanged.

The same all_reduce asks whether every rank's NVRx worker is up. A worker starts in seconds on a quiet
host but in tens of seconds on loaded cores (a fresh interpreter importing torch beside the training
ranks), so the first save of every process would wait for it, and the next save, due before that one was
committed, would block the loop for seconds. While any rank's worker is still starting, the save is
written by the `fallback` backend instead (dcp.save in this thread: a few MB take milliseconds); the
checkpoint is the same DCP checkpoint, its `.metadata` written by dcp.save instead of at commit.

A save the loop waits for at once (the run's last step: `in_process`) is written by the fallback too.
NVRx's worker runs at nice 10 so that it yields to training; with nothing left to train, that only makes
the run's end wait: the worker's part of the final save (plan, hand-over, write) would be most of the
run's tail on shared cores.

The checkpoint is bit for bit the one the direct path writes: the slot holds the same local shards, the
skeleton the same non-tensor values (codec.py keeps tuples and key types), and the DTensor placements
come from the same save dict, so it stays reshardable. A fault at any moment leaves an uncommitted temp
directory, never loaded; the previous committed checkpoint stays.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from trainer.checkpoint.errors import CheckpointWriteError
from trainer.state import codec

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TensorMeta:
    """What the writer needs of one live tensor, read in the loop thread: its local shape and dtype, and
    for a DTensor its spec (mesh, placements, global shape), to wrap the staged copy."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    spec: Any


def tensor_metas(save_dict: dict[str, Any]) -> list[TensorMeta]:
    """One TensorMeta per tensor, in codec.flatten's order (the slot's)."""
    _, tensors = codec.flatten(save_dict)  # local shards, in order
    specs: list[Any] = []

    def walk(v: Any) -> None:
        if isinstance(v, torch.Tensor):
            specs.append(v._spec if isinstance(v, DTensor) else None)
        elif isinstance(v, dict):
            for k, x in v.items():
                walk(k)
                walk(x)
        elif isinstance(v, list | tuple):
            for x in v:
                walk(x)

    walk(save_dict)
    return [TensorMeta(tuple(t.shape), t.dtype, spec) for t, spec in zip(tensors, specs, strict=True)]


def plan_metas(plan: codec.Plan) -> list[TensorMeta]:
    """tensor_metas from a snapshot's codec.Plan: its values (DTensors as they are) and their local
    tensors, already in the slot's order; no walk over the save dict."""
    return [
        TensorMeta(tuple(t.shape), t.dtype, v._spec if isinstance(v, DTensor) else None)
        for v, t in zip(plan.values, plan.tensors, strict=True)
    ]


class MetasCache:
    """The metas of the last snapshot plan seen. Snapshots keep one plan while the live tensors stay put
    (same objects, same storage, so the same shapes and placements), so every save of an attempt after
    the first reads them here: walking the save dict again costs about as long as the snapshot it
    reuses."""

    def __init__(self) -> None:
        self._plan: codec.Plan | None = None
        self._metas: list[TensorMeta] = []

    def of(self, snapshot: Any) -> list[TensorMeta]:
        plan = getattr(snapshot, "plan", None)
        if plan is None:
            return tensor_metas(snapshot.save_dict)
        if plan is not self._plan:
            self._plan, self._metas = plan, plan_metas(plan)
        return self._metas


@dataclass
class SnapshotWrite:
    """One save from a snapshot: the background thread and what it produced (the token)."""

    step: int
    thread: threading.Thread | None = None
    inner: Any = None
    """The writing backend's token, once write_staged returned."""
    backend: Any = None
    """The backend that wrote it: the inner one, or the fallback while the inner one's worker starts."""
    error: BaseException | None = None
    cancel: threading.Event = field(default_factory=threading.Event)
    copied_s: float | None = None
    """Seconds from the thread's start until the slot was copied out and released."""


class FromSnapshot:
    """The backend protocol (backends.py) over an inner backend with `write_staged`, fed from a slot."""

    ABORT_JOIN_S = 2.0

    def __init__(self, inner: Any, *, share_memory: bool, fallback: Any = None) -> None:
        self.inner = inner
        self.fallback = fallback
        """Writes a save while `inner.worker_ready()` is false on any rank (None: always the inner one)."""
        self.share_memory = share_memory  # nvrx: the worker process reads the staged copy
        self._buffers: list[torch.Tensor] = []
        self._current: SnapshotWrite | None = None

    @property
    def defers_metadata(self) -> bool:
        return bool(self.inner.defers_metadata)

    def start(
        self,
        snapshot: Any,
        metas: list[TensorMeta],
        dest: Path,
        pg: dist.ProcessGroup,
        begin: Any = None,
        *,
        in_process: bool = False,
    ) -> SnapshotWrite:
        """Loop thread: hold the snapshot's slot and start the thread; returns at once. `begin(staged)`,
        if given, runs in the thread before the write (the local tier's bookkeeping of the step).
        `in_process`: write with the fallback even though the inner backend's worker is up (the caller
        waits for this save next; see the module doc)."""
        hold = snapshot.hold()
        write = SnapshotWrite(snapshot.step)
        write.thread = threading.Thread(
            target=self._run,
            args=(write, snapshot, hold, metas, dest, pg, begin, in_process),
            name=f"ckpt-from-snapshot-{snapshot.step}",
            daemon=True,
        )
        self._current = write
        try:
            write.thread.start()
        except BaseException:
            hold.release()
            raise
        return write

    def _run(self, write: SnapshotWrite, snapshot: Any, hold: Any, metas: list[TensorMeta],
             dest: Path, pg: dist.ProcessGroup, begin: Any, in_process: bool) -> None:  # fmt: skip
        t0 = time.perf_counter()
        staged: dict[str, Any] | None = None
        problem: BaseException | None = None
        try:
            staged = self._copy_out(snapshot, hold, metas)
        except BaseException as exc:  # reported below, after the agreement
            problem = exc
        finally:
            hold.release()
        write.copied_s = time.perf_counter() - t0
        try:
            # Every rank's thread reaches this collective whatever happened above, so a failed copy on one
            # rank fails the save on all of them without leaving any in the planning collective.
            # ...and every rank writes with the same backend (planning and .metadata differ between them).
            by_fallback = self.fallback is not None and (in_process or not self.inner.worker_ready())
            flag = torch.tensor([0 if problem is None else 1, int(by_fallback)], dtype=torch.int64)
            dist.all_reduce(flag, group=pg)
            if problem is not None:
                message = f"snapshot of step {write.step} not reusable: {problem}"
                raise CheckpointWriteError(message) from problem
            if int(flag[0]) > 0:
                raise CheckpointWriteError(f"another rank could not reuse its snapshot of step {write.step}")
            if write.cancel.is_set():
                raise CheckpointWriteError("save aborted")
            assert staged is not None
            if begin is not None:
                begin(staged)
            write.backend = self.fallback if int(flag[1]) > 0 else self.inner
            write.inner = write.backend.write_staged(staged, dest, pg, write.cancel)
        except BaseException as exc:
            write.error = exc

    def _copy_out(self, snapshot: Any, hold: Any, metas: list[TensorMeta]) -> dict[str, Any]:
        """The held slot's state, copied into this backend's buffers (reused while the layout is)."""
        if len(self._buffers) != len(metas) or any(
            (tuple(b.shape), b.dtype) != (m.shape, m.dtype) for b, m in zip(self._buffers, metas, strict=True)
        ):
            self._buffers = [self._empty(m) for m in metas]
        seen: list[int] = []

        def take(i: int, view: torch.Tensor) -> None:
            if i >= len(metas) or (tuple(view.shape), view.dtype) != (metas[i].shape, metas[i].dtype):
                raise ValueError(f"snapshot tensor {i} does not match the state's layout")
            self._buffers[i].copy_(view)
            seen.append(i)

        skeleton = snapshot.store.read_held(hold, take)
        if len(seen) != len(metas):
            raise ValueError(f"snapshot holds {len(seen)} tensors, the state {len(metas)}")

        def tensor_at(i: int) -> torch.Tensor:
            spec = metas[i].spec
            buf = self._buffers[i]
            return DTensor(buf, spec, requires_grad=False) if spec is not None else buf

        return codec.decode(skeleton, tensor_at)

    def _empty(self, meta: TensorMeta) -> torch.Tensor:
        t = torch.empty(meta.shape, dtype=meta.dtype)
        return t.share_memory_() if self.share_memory else t

    # -------------------------------------------------------------------------- backend protocol
    def done(self, token: SnapshotWrite) -> bool:
        if token.thread is not None and token.thread.is_alive():
            return False
        if token.error is not None:
            exc = token.error
            if isinstance(exc, CheckpointWriteError):
                raise exc
            raise CheckpointWriteError(f"background write failed: {exc}") from exc
        return bool(token.backend.done(token.inner))

    def results(self, token: SnapshotWrite) -> Any:
        return token.backend.results(token.inner)

    def finish(self, token: SnapshotWrite, gathered: list[Any]) -> None:
        token.backend.finish(token.inner, gathered)

    def release(self, token: SnapshotWrite) -> None:
        """The save is committed: drop its writer (NVRx's holds the write buckets of the whole state).
        Called where the commit runs (the manager's commit thread in a training run); dropped at the next
        start() instead, freeing the buckets of a large shard would take the loop's time."""
        token.inner = None

    def abort(self) -> None:
        """Stop the current write: the thread stops before writing (or its cancellable writer at its next
        write); the inner backend's writers are stopped as for a direct save."""
        write, self._current = self._current, None
        if write is not None:
            write.cancel.set()
            if write.thread is not None:
                write.thread.join(self.ABORT_JOIN_S)
                if write.thread.is_alive():
                    log.warning(
                        "checkpoint-from-snapshot thread of step %d still running after abort", write.step
                    )
        self.inner.abort()
        if self.fallback is not None:
            self.fallback.abort()

    def close(self, timeout_s: float) -> None:
        """Drop the staging buffers (the manager closes the inner backend itself)."""
        self._buffers = []
