"""The save-and-commit half of a CheckpointManager (manager.py): save (async per mode), commit atomically.

Collective contract: every rank calls save / maybe_finalize / wait / restore at the same points (the
loop calls maybe_finalize after every step; it asks the other ranks only at the steps policy.poll_due
names). abort / close are local (no collectives: they run in teardown, when peers may be gone).
With commit_in_background (the training loop's setting) step 2 and 3 below run in a thread of their own
per save (committer.py) and the caller's maybe_finalize does nothing; wait(), the next save and restore
join that thread, so a failure still reaches every rank at the same call.
The manager talks over its own gloo process group, so its collectives never interleave with the
training group's (torch-async runs some in a thread), and a CPU group is what the NVRx and torch
background paths need even when training uses NCCL.

Life of one save (at most one is in flight; a new save first finishes the previous one):
  1. save(): this rank's part of the write starts (see backends.py); the loop waits only for that.
  2. maybe_finalize(): when this rank's write is finished, its shard files are fsynced and CRC32'd
     (in a helper thread for the async modes). At the calls policy.poll_due names (not every step), one
     small all_reduce tells every rank whether all ranks are done, or whether any failed (then every
     rank raises CheckpointWriteError and the save is discarded; the manager stays usable). wait() (and
     a save while one is pending) repeats that agreement in rounds until all are done, calling
     hooks.progress between rounds: no rank sits in a collective while a peer is still writing.
  3. commit (all ranks): hooks.before_commit(step) runs on every rank, then rank 0 gathers the file
     lists (and NVRx's write results, from which it writes the DCP .metadata), writes MANIFEST.json,
     renames the directory to step_<N> (the moment it becomes visible), applies retention
     (committed.py, policy.to_delete) and emits `ckpt_commit`. Every wait is bounded by write_timeout_s
     or the group's timeout.
With a node-local tier (cfg.local_dir) the shards are written there instead, and step 3 comes twice:
first the local seal (drain.py: .metadata to every node, each rank's seal, then each rank copies its
files into the temp directory in the background), then, once every rank's copy is polled done like a
write, the commit above. before_commit runs before the first of the two.
"""

from __future__ import annotations

import functools
import logging
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint import CheckpointException

from trainer.checkpoint import layout, policy
from trainer.checkpoint.backends import TorchAsyncBackend, make_backend
from trainer.checkpoint.committer import BackgroundCommit
from trainer.checkpoint.context import CheckpointContext
from trainer.checkpoint.drain import SaveToSeal, SealGroup, seal_and_drain
from trainer.checkpoint.errors import CheckpointWriteError
from trainer.checkpoint.from_snapshot import FromSnapshot, MetasCache
from trainer.resilience.progress import write_iteration_file
from trainer.state.save_dict import build_save_dict, fingerprint, tensor_bytes

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CheckpointHooks:
    """Callbacks into the checkpoint's life (fault injection uses them)."""

    before_commit: Callable[[int], None] | None = None
    """Called on every rank with the step, after that rank's shard files are durable, before the commit."""
    after_write: Callable[[int], None] | None = None
    """Called on a rank with the step when its background write reports done; raising fails the save as
    a failed write would (the ckpt-write-error fault)."""
    progress: Callable[[], None] | None = None
    """Called between the agreement rounds of a blocking wait and while a save waits for NVRx's worker to
    start (the trainer pings the in-process Wrapper from it): such waits are bounded by write_timeout_s."""


@dataclass(frozen=True)
class SaveResult:
    blocked_s: float
    """Seconds save() kept the caller waiting."""
    bytes: int
    """Bytes of tensor data this rank contributes to the checkpoint."""


@dataclass
class _Pending:
    step: int
    tmp: Path
    token: Any
    t0: float
    files: Future[dict[str, Any]] | None = None
    error: str | None = None
    """This rank's part failed (sticky: the failure is reported at the next poll)."""
    calls: int = 0
    """Non-blocking finalize calls since the save (policy.poll_due decides which of them poll)."""
    src: Path | None = None
    """Where the backend writes this rank's shards: the local tier's step directory, else `tmp`."""
    phase: str = "write"
    """write (shards being written), then with a local tier drain (sealed locally, copying to `tmp`)."""
    cancel: threading.Event = field(default_factory=threading.Event)
    """Set by abort(): a drain still copying stops at its next chunk."""
    backend: Any = None
    """The backend writing it: the manager's, or its FromSnapshot wrapper (a save from a snapshot)."""


class CheckpointSaver:
    """One rank's saves: at most one in flight, written by the backend, agreed, committed (or sealed on
    the local tier and drained first)."""

    BLOCKING_POLL_S = (0.05, 0.5)
    """A blocking wait's first and longest local wait between two agreement rounds (doubling between)."""

    def __init__(
        self,
        ctx: CheckpointContext,
        *,
        hooks: CheckpointHooks,
        events: Any,
        retain: Callable[[Path], list[Path]],
        commit_in_background: bool,
        start_writers_later: bool,
    ) -> None:
        """`retain`: retention after each commit (CommittedCheckpoints.retain, rank 0). The other
        arguments are CheckpointManager's. The writers are built here: after the directory is claimed."""
        self.ctx, self.cfg, self.rank, self.world_size = ctx, ctx.cfg, ctx.rank, ctx.world_size
        self.hooks, self.events, self._retain = hooks, events, retain
        self.local = ctx.local
        self._pending: _Pending | None = None
        self.commit_in_background = commit_in_background
        self._committer: BackgroundCommit | None = None
        self._metas = MetasCache()
        self._commit_lock = threading.Lock()
        """Held by rank 0 around its commit's file work, so that an abort never discards a temp directory
        that a background commit is renaming (abort takes it; a cancelled commit writes nothing)."""
        self.committed_step = -1
        """Step of the newest checkpoint this manager committed (-1: none yet)."""
        self.polls = 0
        """Cross-rank agreements on pending saves so far (each one all_reduce)."""
        self._hasher = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-crc")
        cfg = self.cfg
        self._backend = make_backend(
            cfg.mode, cfg.write_timeout_s, hooks.progress, start_worker=not start_writers_later
        )
        self._from_snapshot = (  # saves that reuse the snapshot of their step (from_snapshot.py)
            FromSnapshot(
                self._backend,
                share_memory=cfg.mode == "nvrx",
                fallback=TorchAsyncBackend() if cfg.mode == "nvrx" else None,
            )
            if self._backend.reuses_snapshots
            else None
        )

    def start_writers(self) -> None:
        """Start the writers' helper processes (NVRx's worker) if they are not started yet; cheap after."""
        start = getattr(self._backend, "start_worker", None)
        if start is not None:
            start()

    # ------------------------------------------------------------------------------------------- save
    def save(
        self, step: int, state: dict[str, Any], snapshot: Any = None, *, awaited: bool = False
    ) -> SaveResult:
        """Start a checkpoint of `state` labelled `step`; returns how long the caller was blocked.

        In sync mode the checkpoint is committed when this returns; otherwise maybe_finalize/wait commit
        it. Raises CheckpointWriteError if this or the previous save failed. `snapshot`: the snapshot the
        loop just took (trainer/snapshot/store.py Reusable); when it is of this step and the mode is
        asynchronous, the save is written from it in the background (from_snapshot.py) and this returns
        at once. `awaited`: the caller waits for this save next (the run's last step), so a save from a
        snapshot is written in this process, not handed to NVRx's worker (from_snapshot.py).
        """
        t0 = time.perf_counter()
        if self._pending is not None or self._committer is not None:
            self.wait()
        if self.ctx.fingerprint is None:
            self.ctx.fingerprint = fingerprint(state)
        tmp = self.cfg.dir / layout.temp_name(step)
        if self.rank == 0:
            layout.discard(tmp)  # a leftover of an interrupted save of the same step
            tmp.mkdir(parents=True)
        if self._reuses(snapshot, step):
            return self._save_from_snapshot(step, snapshot, tmp, t0, awaited)
        dist.barrier(group=self.ctx.group())  # nobody writes into tmp before it is fresh
        sd = build_save_dict(state, self.rank)
        nbytes = tensor_bytes(sd)
        src = self.local.begin(step, sd) if self.local is not None else tmp
        try:
            token = self._backend.start(sd, src, self.ctx.writer_group())
        except BaseException as exc:  # also the Wrapper's asynchronous restart landing mid-write
            self._backend.abort()
            if self.rank == 0:
                layout.discard(tmp)
            if isinstance(exc, CheckpointWriteError):
                raise CheckpointWriteError(f"checkpoint of step {step} failed: {exc}", step) from exc
            raise
        self._pending = _Pending(step, tmp, token, t0, src=src, backend=self._backend)
        if self.cfg.mode == "sync":
            self._finalize(blocking=True)
        else:
            self._commit_later(step)
        return SaveResult(blocked_s=time.perf_counter() - t0, bytes=nbytes)

    def _reuses(self, snapshot: Any, step: int) -> bool:
        return self._from_snapshot is not None and snapshot is not None and snapshot.step == step

    def _save_from_snapshot(
        self, step: int, snapshot: Any, tmp: Path, t0: float, awaited: bool
    ) -> SaveResult:
        """The save's loop-thread part when it reuses the snapshot of its step: hold the slot, note the
        placements, start the thread (from_snapshot.py). The temp directory is fresh before any rank
        writes: rank 0 made it above, and every rank's thread agrees (a collective) before writing."""
        assert self._from_snapshot is not None
        metas = self._metas.of(snapshot)
        nbytes = sum(math.prod(m.shape) * m.dtype.itemsize for m in metas)
        src, begin = tmp, None
        if self.local is not None:
            local = self.local
            src = local.step_dir(step)
            begin = functools.partial(local.begin, step)  # in the thread: the staged copy's values
        try:
            token = self._from_snapshot.start(
                snapshot, metas, src, self.ctx.writer_group(), begin, in_process=awaited
            )
        except BaseException:
            self._from_snapshot.abort()
            if self.rank == 0:
                layout.discard(tmp)
            raise
        self._pending = _Pending(step, tmp, token, t0, src=src, backend=self._from_snapshot)
        if not awaited:  # an awaited save (the run's last) is waited for at once, in this thread
            self._commit_later(step)
        return SaveResult(blocked_s=time.perf_counter() - t0, bytes=nbytes)

    def maybe_finalize(self, blocking: bool = False) -> list[int]:
        """Commit the pending save if every rank finished writing; returns the committed steps.

        Non-blocking calls check this rank's write every time (no collective) but ask the other ranks
        only at the calls policy.poll_due names, the same calls on every rank.
        """
        if self._committer is not None:
            return self._join_committer() if blocking else []
        p = self._pending
        if p is None:
            return []
        if not blocking:
            p.calls += 1
            self._local_state(p)  # starts fsync + CRC32 as soon as the write is done
            if not policy.poll_due(p.calls):
                return []
        return self._finalize(blocking)

    def wait(self) -> list[int]:
        """Finish and commit everything pending (bounded by write_timeout_s); returns the committed steps."""
        return self.maybe_finalize(blocking=True)

    def abort(self) -> None:
        """Abandon the pending save now, on this rank only (no collective): stop its writers, so that none
        of them writes into the checkpoint directory again, and (rank 0) discard its temporary directory.
        A background commit still running is left to end on its own: it commits nothing after this.
        The manager stays usable; the next save starts fresh writers."""
        self._committer = None
        self._abort_pending()

    def _abort_pending(self) -> None:
        p, self._pending = self._pending, None
        if p is None:
            return
        p.cancel.set()
        (p.backend or self._backend).abort()
        if self.rank == 0:
            with self._commit_lock:  # a background commit's rename finishes first; a later one sees cancel
                try:
                    layout.discard(p.tmp)
                except OSError as exc:  # another rank's stopped writer may still hold it for a moment
                    log.warning("could not discard %s: %s", p.tmp, exc)

    def _commit_later(self, step: int) -> None:
        """With commit_in_background: the pending save's blocking finalize, in its own thread."""
        if self.commit_in_background:
            self._committer = BackgroundCommit(lambda: self._finalize(blocking=True, in_thread=True), step)

    def _join_committer(self) -> list[int]:
        """The background commit's outcome (CheckpointWriteError when the save failed), pinging the
        loop's progress while it runs."""
        committer, self._committer = self._committer, None
        assert committer is not None
        return committer.join(self.hooks.progress)

    # --------------------------------------------------------------------------------------- finalize
    def _local_state(self, p: _Pending, wait_s: float = 0.0) -> tuple[str, str | None]:
        """("pending" | "ready" | "failed", reason) of this rank's part of the pending save, waiting up to
        wait_s for it to leave "pending" (never past the write's deadline)."""
        deadline = p.t0 + self.cfg.write_timeout_s
        give_up = time.perf_counter() + wait_s
        while p.error is None:
            try:
                if p.files is None and p.backend.done(p.token):
                    if self.hooks.after_write is not None:
                        self.hooks.after_write(p.step)
                    p.files = self._hasher.submit(self._durable_files, p.src or p.tmp)
                if p.files is not None and p.files.done():
                    p.files.result()  # re-raises a hashing error
                    return "ready", None
            except (Exception, CheckpointException) as exc:
                p.error = f"rank {self.rank}: {exc}"
                break
            if time.perf_counter() > deadline:
                p.error = f"rank {self.rank}: write not finished after {self.cfg.write_timeout_s} s"
                break
            if time.perf_counter() >= give_up:
                return "pending", None
            time.sleep(0.005)
        return "failed", p.error

    def _durable_files(self, tmp: Path) -> dict[str, Any]:
        """fsync this rank's shard files (and the directory) and describe them for the manifest."""
        names = sorted(p.name for p in tmp.glob(f"__{self.rank}_*") if p.is_file())
        layout.fsync_files(tmp, names)
        layout.fsync_dir(tmp)
        return layout.describe_files(tmp, names)

    def _finalize(self, blocking: bool, in_thread: bool = False) -> list[int]:
        """One agreement (non-blocking), or rounds of them until every rank is done (blocking).

        A blocking wait never parks a rank in a collective while a peer still writes: a rank whose write
        is done would sit in C for as long as the slowest peer's write, where the group's collective
        timeout (shorter than write_timeout_s) fails it and the Wrapper's progress watchdog cannot be fed.
        In each round a rank waits for its own write at most `pause` seconds, then all agree; every rank
        runs the same rounds, so the collectives pair up. write_timeout_s bounds the whole wait.
        `in_thread`: run by a BackgroundCommit, which must not feed the loop's progress watchdog.
        """
        p = self._pending
        assert p is not None
        pause = self.BLOCKING_POLL_S[0] if blocking else 0.0
        while True:
            state, reason = self._local_state(p, wait_s=pause)
            self.polls += 1
            flags = torch.tensor([state == "pending", state == "failed"], dtype=torch.int64)
            dist.all_reduce(flags, group=self.ctx.group())
            if flags[1] > 0:
                reasons: list[Any] = [None] * self.world_size
                dist.all_gather_object(reasons, reason, group=self.ctx.group())
                self._fail(p, "; ".join(str(r) for r in reasons if r))
            if flags[0] == 0:
                break
            if not blocking:
                return []
            if self.hooks.progress is not None and not in_thread:
                self.hooks.progress()
            pause = min(pause * 2, self.BLOCKING_POLL_S[1])
        self._commit(p)
        if self._pending is p:  # sealed on the local tier, now draining: committed once that is done
            return self._finalize(blocking, in_thread) if blocking else []
        return [p.step]

    def _fail(self, p: _Pending, reason: str) -> None:
        self._abort_pending()
        raise CheckpointWriteError(f"checkpoint of step {p.step} failed: {reason}", p.step)

    def _commit(self, p: _Pending) -> None:
        if self.hooks.before_commit is not None and p.phase == "write":
            self.hooks.before_commit(p.step)
        if self.local is not None and p.phase == "write":
            self._seal(p)  # the local commit; this commit runs again once the drain is done
            return
        payload: dict[str, Any] = {
            "files": p.files.result() if p.files else {},
            "results": None,
            "error": None,
        }
        if p.backend.defers_metadata and p.phase == "write":  # after a drain, .metadata is there
            try:
                payload["results"] = p.backend.results(p.token)
            except CheckpointWriteError as exc:
                payload["error"] = f"rank {self.rank}: {exc}"
        gathered: list[Any] | None = [None] * self.world_size if self.rank == 0 else None
        dist.gather_object(payload, gathered, dst=self.ctx.global_rank0(), group=self.ctx.group())
        outcome: list[Any] = [None]
        if self.rank == 0:
            assert gathered is not None
            with self._commit_lock:
                aborted = p.cancel.is_set()  # aborted in teardown while this commit ran in its thread
                outcome[0] = (False, "aborted") if aborted else self._write_commit(p, gathered)
        dist.broadcast_object_list(outcome, src=self.ctx.global_rank0(), group=self.ctx.group())
        self._pending = None
        ok, detail = outcome[0]
        if not ok:
            p.backend.abort()
            raise CheckpointWriteError(f"checkpoint of step {p.step} failed at commit: {detail}", p.step)
        self.committed_step = p.step
        release = getattr(p.backend, "release", None)
        if release is not None:
            release(p.token)

    def _write_commit(self, p: _Pending, gathered: list[dict[str, Any]]) -> tuple[bool, str]:
        """Rank 0: metadata (NVRx), manifest, rename, retention, event. Returns (ok, path or reason)."""
        try:
            errors = [g["error"] for g in gathered if g["error"]]
            if errors:
                raise CheckpointWriteError("; ".join(errors))
            if p.backend.defers_metadata and p.phase == "write":
                p.backend.finish(p.token, [g["results"] for g in gathered])
            files: dict[str, Any] = {}
            for g in gathered:
                files.update(g["files"])
            layout.fsync_files(p.tmp, [".metadata"])
            files.update(layout.describe_files(p.tmp, [".metadata"]))
            stray = sorted({q.name for q in p.tmp.iterdir()} - set(files))
            if stray:
                raise CheckpointWriteError(f"files no rank accounted for: {', '.join(stray)}")
            ctx = self.ctx
            assert ctx.fingerprint is not None
            extra: dict[str, Any] = {"world_size": self.world_size, "mode": self.cfg.mode}
            extra.update({layout.OWNER: ctx.lease.job, layout.LINEAGE: ctx.lineage})
            final = layout.commit(
                p.tmp, p.step, files, {**extra, layout.FINGERPRINT: ctx.fingerprint}, key=ctx.key
            )
            self._retain(final)
            write_iteration_file(self.cfg.dir, p.step)  # ft_launcher's progress tracker reads it
        except Exception as exc:
            layout.discard(p.tmp)
            return False, f"{type(exc).__name__}: {exc}"
        if self.events is not None:
            wrote_with = getattr(p.token, "backend", None)  # a save from a snapshot: which backend wrote it
            self.events.emit(
                "ckpt_commit",
                step=p.step,
                path=str(final),
                total_s=time.perf_counter() - p.t0,
                fallback=wrote_with is not None and wrote_with is getattr(p.backend, "fallback", None),
            )
        return True, str(final)

    @property
    def pending_step(self) -> int:
        """Step of the save in flight (-1: none)."""
        return self._pending.step if self._pending is not None else -1

    @property
    def busy(self) -> bool:
        """A save is pending or its background commit still runs (wait() finishes it)."""
        return self._pending is not None or self._committer is not None

    # ------------------------------------------------------------------------------------------ close
    def close(self) -> None:
        """Abandon a pending save (its temp dir is never loaded) and release the writers. No collectives."""
        self.abort()
        self._backend.close(timeout_s=5.0)
        if self._from_snapshot is not None:
            self._from_snapshot.close(timeout_s=5.0)
        self._hasher.shutdown(wait=False, cancel_futures=True)

    # ---------------------------------------------------------------------------------------- helpers
    def _seal(self, p: _Pending) -> None:
        """Seal the written save on the local tier and start its drain (drain.py); a save that cannot be
        sealed is aborted like a failed write."""
        assert self.local is not None and self.ctx.fingerprint is not None
        assert p.files is not None and p.src is not None
        group = SealGroup(
            rank=self.rank,
            world_size=self.world_size,
            group=self.ctx.group(),
            root=self.ctx.global_rank0(),
            backend=p.backend,
            local=self.local,
            fingerprint=self.ctx.fingerprint,
            copier=self._hasher,
        )
        save = SaveToSeal(p.step, p.token, p.files.result(), p.src, p.tmp, p.cancel)
        try:
            drain = seal_and_drain(group, save)
        except CheckpointWriteError:
            self._abort_pending()
            raise
        p.phase, p.calls, p.files = "drain", 0, drain
