"""`RunningJob`: the runtime's implementation of the api's `Job` view, and the step loop around the team's
step.

Built by trainer/runtime/train.py once per attempt from the process's internals (its session, event log,
fault injector, heartbeat, in-process Wrapper and snapshots); the training function sees only the
read-only `trainer.api.Job`. What the attempt leaves for the runtime (the last step done, whether the
loop finished, the final state's digests) is read here, never written from outside.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, cast

import torch
from torch.distributed.checkpoint.stateful import Stateful
from torch.distributed.device_mesh import DeviceMesh

from trainer.api import misuse, rng
from trainer.api.job import Batch, Job, JobConfig, StatefulData
from trainer.digest.state_hash import state_digests
from trainer.events import spans
from trainer.recovery.restore import restore_attempt
from trainer.resilience import suspect
from trainer.resilience.guard import Guard, Windows
from trainer.runtime.faults import corrupt_checkpoint
from trainer.runtime.preflight import job_config
from trainer.runtime.step_check import Checked, StepCheck
from trainer.runtime.straggler_watch import EVICT_FLUSH_S, StragglerWatch, slots

if TYPE_CHECKING:
    from trainer.config.train_config import TrainConfig
    from trainer.events.metrics import EventLog
    from trainer.resilience.heartbeat import Heartbeat
    from trainer.runtime.faults import FaultInjector
    from trainer.runtime.session import ProcessInfo, Session
    from trainer.snapshot.manager import Snapshots

log = logging.getLogger(__name__)


class GuardRollbackError(RuntimeError):
    """The guard tripped before any state was kept to roll back to: a new attempt starts the run afresh
    (the record makes it skip the batch)."""


class LoopState(Stateful):
    """The library's own checkpoint entry ("trainer"): last step done, the data position, the RNG streams
    and, with the numerical guard on, its windows of recent values (so a resumed run judges alike)."""

    def __init__(self, data: StatefulData[object] | None, device: torch.device, guard: Guard) -> None:
        self.step = -1
        self.data = data  # None: a data source whose position is not saved (allow_unsaved_data)
        self.device = device
        self.guarded = guard.enabled
        self.windows = Windows(guard.cfg.window)

    def state_dict(self) -> dict[str, Any]:
        data = self.data.state_dict() if self.data is not None else {}
        state = {"step": self.step, "data": data, "rng": rng.capture(self.device)}
        if self.guarded:  # with the guard off the entry is what it was without one
            state["guard"] = self.windows.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])
        if self.data is not None:
            self.data.load_state_dict(state["data"])
        rng.restore(state["rng"], self.device)
        self.windows.load_state_dict(state.get("guard"))


class RunningJob(Job):
    """One attempt's `Job`: the view the training function gets, over the runtime's internals."""

    def __init__(
        self,
        cfg: TrainConfig,
        proc: ProcessInfo,
        session: Session,
        *,
        events: EventLog,
        faults: FaultInjector,
        heartbeat: Heartbeat,
        call_wrapper: Any,
        snapshots: Snapshots,
        guard: Guard,
    ) -> None:
        self._cfg, self._proc, self._session = cfg, proc, session
        self._config = job_config(cfg)
        self._events, self._faults, self._heartbeat = events, faults, heartbeat
        self._call_wrapper, self._snapshots = call_wrapper, snapshots  # call_wrapper: NVRx's, or None
        self._guard = guard
        self._check: StepCheck | None = None
        self._loss: torch.Tensor | None = None
        self._tokens: int | None = None
        self._looped = False
        self._finished = False
        self.final_digests: dict[str, str] | None = None
        """The final state's digests (trainer/digest/state_hash.py), on rank 0 once `loop` finished; else
        None. Read by the runtime, not part of the api's view."""
        self.last_step = -1
        """The last step this attempt completed (-1: none); read by the runtime."""

    @property
    def config(self) -> JobConfig:
        return self._config

    @property
    def rank(self) -> int:
        return self._proc.rank

    @property
    def world_size(self) -> int:
        return self._proc.world_size

    @property
    def local_rank(self) -> int:
        return self._proc.local_rank

    @property
    def node(self) -> int:
        return self._proc.node

    @property
    def device(self) -> torch.device:
        assert self._session.device is not None
        return self._session.device

    @property
    def mesh(self) -> DeviceMesh:
        assert self._session.mesh is not None, "the session is open for the whole attempt"
        return self._session.mesh

    @property
    def attempt(self) -> int:
        return int(self._call_wrapper.iteration) if self._call_wrapper is not None else 0

    @property
    def entries(self) -> Mapping[str, object]:
        # Held by the session alone, so its teardown drops the last reference to the model and its groups.
        return dict(self._session.entries)

    @property
    def finished(self) -> bool:
        return self._finished

    def device_mesh(self, shape: tuple[int, ...], names: tuple[str, ...]) -> DeviceMesh:
        return self._session.extra_mesh(shape, names)

    def log(self, loss: torch.Tensor | float, *, tokens: int | None = None) -> None:
        value = loss.detach() if isinstance(loss, torch.Tensor) else torch.tensor(float(loss))
        self._loss = self._check.faulted_loss(value) if self._check is not None else value
        self._tokens = tokens

    def loop(
        self,
        *,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        data: StatefulData[Batch] | Iterable[Batch],
        scheduler: Stateful | None = None,
        state: Mapping[str, Stateful] | None = None,
        allow_unsaved_data: bool = False,
    ) -> Iterator[tuple[int, Batch]]:
        spans.mark("build")  # the training function's own work before the loop: model, optimizer, data
        if self._looped:
            raise misuse.Misuse("job.loop", "called twice in one attempt: run every step in one loop")
        self._looped = True
        misuse.check_model(model)
        misuse.check_optimizer(optimizer, model)
        source, position_saved = misuse.check_data(data, allow_unsaved=allow_unsaved_data)
        extra = misuse.check_state(scheduler, state)
        misuse.check_groups(self._session.known_groups)
        loop_state = LoopState(source if position_saved else None, self.device, self._guard)
        entries = {"model": model, "optim": optimizer, "trainer": loop_state, **extra}
        misuse.check_encodable({k: v for k, v in entries.items() if k not in ("model", "optim")})
        if not position_saved:
            log.warning(
                "data: %s cannot save its position; a resume repeats or skips data", type(data).__name__
            )
            if self.rank == 0:
                self._events.emit("data_position_unsaved", data=type(data).__name__)
        self._session.entries = entries
        spans.mark("checks")
        return self._steps(entries, loop_state, source)  # checked now, at the call, not at the first next()

    def _steps(
        self, entries: dict[str, Any], loop_state: LoopState, data: Iterable[Batch]
    ) -> Iterator[tuple[int, Batch]]:
        s, faults, steps = self._session, self._faults, self._cfg.run.steps
        restored = restore_attempt(self._snapshots, s.ckpt, entries, self.device, self._events).step
        if restored >= 0 and loop_state.step != restored:
            raise RuntimeError(f"checkpoint of step {restored} holds trainer step {loop_state.step}")
        self._heartbeat.start()
        # iter() after the restore: a DataLoader's iterator starts at the restored position
        batches = cast(Iterator[Batch], data) if hasattr(data, "__next__") else iter(data)
        self._check = check = StepCheck(
            self._guard, entries["optim"], loop_state.windows, faults,
            rank=self.rank, world_size=self.world_size, device=self.device,
            extra=slots(self.world_size),
        )  # fmt: skip
        # Every rank's step timings ride in the check's one all_reduce, after the guard's numbers.
        watch = StragglerWatch(self._cfg, self._proc, self._events, faults, check.extra)
        try:
            step = loop_state.step + 1
            while step < steps:
                faults.at_step(
                    step,
                    corrupt_newest=self._corrupt_newest,
                    corrupt_snapshot=self._corrupt_snapshot,
                    damage_replicas=self._damage_replicas,
                    keeps_replica_of=self._keeps_replica_of,
                )
                t_start = time.time()
                batch = self._next_batch(batches, step, steps)
                self._loss, self._tokens = None, None
                check.begin(step)
                yield step, batch
                check.end()
                watch.arrive(step, t_start)
                t_reduce = time.time()
                checked = check.reduce(self._loss)
                watch.reduced(step, time.time() - t_reduce)
                if checked.verdict is not None and not checked.verdict.ok:
                    # Nothing of this step is kept: no step event, snapshot or save; every rank restores
                    # the newest good state and runs this step again on the next batch.
                    step = self._roll_back(step, checked, entries, loop_state) + 1
                    continue
                loop_state.step = self.last_step = step
                self._after_step(step, t_start, batch, checked, entries, watch.straggler_s)
                watch.after_step(self._flush_replica)
                step += 1
        finally:
            check.close()
        self._heartbeat.pause()  # no more steps: the final commit and the run's end: the static timeout
        # The final state's digest (a collective) while the final save writes in the background: the run's
        # tail is the longer of the two, not their sum (the save's agreement has its own group).
        self.final_digests = state_digests(entries)
        self.ping()  # the full-state gather and hash may take long on a big model
        s.ckpt.finish(entries)  # run_end follows only once the last step is committed
        self.ping()
        self.last_step = loop_state.step
        self._finished = True

    def _next_batch(self, batches: Iterator[Batch], step: int, steps: int) -> Batch:
        """The batch of `step`, after dropping the batches the guard skipped there (the run's record)."""
        try:
            for _ in range(self._guard.skips_at(step)):
                next(batches)
            return next(batches)
        except StopIteration:
            raise misuse.Misuse(
                "data", f"ran out of batches at step {step} of {steps}: make it endless (epochs)"
            ) from None

    def _after_step(
        self,
        step: int,
        t_start: float,
        batch: object,
        checked: Checked,
        entries: dict[str, Any],
        straggler_s: float = 0.0,
    ) -> None:
        """A step that passed: its event, then the snapshot, the beat and the save it may be due.
        `straggler_s`: what the step waited for a straggling node (the straggler watch's)."""
        t_end = time.time()
        if self.rank == 0:
            self._events.emit(
                "step",
                step=step,
                t_start=t_start,
                t_end=t_end,
                loss=checked.loss_mean,
                tokens=_tokens(batch, self.world_size)
                if self._tokens is None
                else self._tokens * self.world_size,
                straggler_s=round(straggler_s, 6),
            )
        snap = self._snapshots.after_step(step, entries)
        if snap is not None:
            self._events.emit(
                "snapshot", step=step, blocked_s=snap.blocked_s, copy_s=snap.copy_s, bytes=snap.bytes
            )
        self._heartbeat.beat()
        self.ping()
        self._session.ckpt.after_step(step, entries, snap.reusable if snap is not None else None)
        self.ping()  # a save that blocked is progress too: each wait gets the whole soft timeout

    def _roll_back(self, step: int, checked: Checked, entries: dict[str, Any], loop_state: LoopState) -> int:
        """The guard tripped at `step` on some rank: record the skip, restore the newest good state on
        every rank (a collective), report; returns the step restored."""
        t0 = time.perf_counter()
        assert self._check is not None
        ranks = self._check.tripped_ranks(checked)
        if checked.finding is not None:
            self._events.emit(
                "guard_tripped",
                step=step,
                reason=checked.finding,
                loss=checked.loss,
                grad_norm=checked.grad_norm,
            )
        trip = self._guard.tripped(step, ranks)  # rank 0 has written the record before it restores
        self._session.ckpt.settle()  # a save in flight commits first: the agreement must see it
        restored = restore_attempt(
            self._snapshots, self._session.ckpt, entries, self.device, self._events
        ).step
        if restored < 0:
            # Nothing to restore (no snapshot or checkpoint yet): only a fresh attempt rebuilds the model.
            raise GuardRollbackError(f"guard tripped at step {step} before any state was kept: restarting")
        if loop_state.step != restored:
            raise RuntimeError(f"checkpoint of step {restored} holds trainer step {loop_state.step}")
        self.last_step = restored
        if self.rank == 0:
            self._events.emit(
                "guard_rollback", step=step, restored_step=restored, ranks=ranks,
                rollback_s=time.perf_counter() - t0,
            )  # fmt: skip
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
        for rank in trip.suspects:
            why = f"{self._guard.record.trips[rank]} guard trips on rank {rank} (last at step {step})"
            suspect.report(
                suspect.SuspectNode(suspect.node_of(rank, local_world), (rank,), "guard", why, step),
                self._events,
                rank=self.rank,
            )
        self.ping()
        return restored

    def ping(self) -> None:
        ping(self._call_wrapper)

    def _corrupt_newest(self) -> None:
        ckpt = self._session.ckpt
        local = ckpt.manager.local
        corrupt_checkpoint(ckpt.latest_committed_path(), local.root if local is not None else None)

    def _corrupt_snapshot(self) -> None:
        store = self._snapshots.store
        if store is not None:
            store.damage_newest()

    def _flush_replica(self) -> None:
        """Wait (bounded) until this rank's newest snapshot reached its peer: a straggler's eviction."""
        peers = self._snapshots.peers
        if peers is not None and not peers.flush(EVICT_FLUSH_S):
            log.warning("straggler: the newest snapshot's replica was not sent in %.0f s", EVICT_FLUSH_S)

    def _keeps_replica_of(self, owner: int) -> bool:
        peers = self._snapshots.peers
        return peers is not None and peers.owner == owner

    def _damage_replicas(self, owner: int) -> None:
        peers = self._snapshots.peers
        if peers is not None:
            peers.damage_held(owner)


def ping(call_wrapper: Any) -> None:
    """Progress for the in-process Wrapper's soft timeout (None: tier 1 off)."""
    if call_wrapper is not None:
        call_wrapper.ping()


def _tokens(batch: object, world_size: int) -> int:
    """Tokens in this step across ranks, when the batch says: an (inputs, targets) pair or a dict with
    `input_ids` of integer ids (0 otherwise: pass `tokens=` to `job.log`)."""
    first = batch[0] if isinstance(batch, tuple | list) and batch else batch
    if isinstance(first, Mapping):
        first = first.get("input_ids")
    if isinstance(first, torch.Tensor) and not first.is_floating_point():
        return int(first.numel()) * world_size
    return 0
