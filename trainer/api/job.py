"""`Job`: what the library hands a training function once per attempt, and the step loop around its step.

One attempt is one call of the team's function: the first in a process, and again in the same process
after each in-process restart (tier 1). The library has built the process group and `job.mesh` before
the call and tears both down after it, whatever the function does. Inside, `job.loop(...)` is the whole
contract: it checks what it is given (trainer/api/misuse.py), restores the newest state every rank has
(memory, /dev/shm, a peer's replica, NVMe, FSx), then yields `(step, batch)` for each remaining step and,
at each step boundary the body hands back, records the step, snapshots, beats and saves.

Step numbering (shared with the event log and the checkpoints): steps are 0-based; a checkpoint is
labelled with the last step it includes; a run resumes at `restored.step + 1` (-1 = nothing restored).
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.stateful import Stateful

from trainer.api import misuse, rng
from trainer.digest.state_hash import state_digests
from trainer.events import spans

if TYPE_CHECKING:
    from trainer.config.train_config import TrainConfig
    from trainer.events.metrics import EventLog
    from trainer.runtime.faults import FaultInjector
    from trainer.runtime.session import ProcessInfo, Session
    from trainer.snapshot.manager import Snapshots

log = logging.getLogger(__name__)

TrainFn = Callable[["Job"], Any]
"""A training function: called with the `Job` once per attempt (trainer/api/__init__.py)."""


class LoopState(Stateful):
    """The library's own checkpoint entry ("trainer"): last step done, the data position, the RNG streams."""

    def __init__(self, data: Any, device: torch.device) -> None:
        self.step = -1
        self.data = data  # None: a data source whose position is not saved (allow_unsaved_data)
        self.device = device

    def state_dict(self) -> dict[str, Any]:
        data = self.data.state_dict() if self.data is not None else {}
        return {"step": self.step, "data": data, "rng": rng.capture(self.device)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])
        if self.data is not None:
            self.data.load_state_dict(state["data"])
        rng.restore(state["rng"], self.device)


class Job:
    """The job as one attempt of the training function sees it. Read-only but for `loop` and `log`."""

    def __init__(
        self,
        cfg: TrainConfig,
        proc: ProcessInfo,
        session: Session,
        *,
        events: EventLog,
        faults: FaultInjector,
        heartbeat: Any,
        call_wrapper: Any,
        snapshots: Snapshots,
    ) -> None:
        self._cfg, self._proc, self._session = cfg, proc, session
        self._events, self._faults, self._heartbeat = events, faults, heartbeat
        self._call_wrapper, self._snapshots = call_wrapper, snapshots
        self._loss: torch.Tensor | None = None
        self._tokens: int | None = None
        self._looped = False
        self.finished = False
        """True once `loop` ran its last step and the final save committed."""
        self.final_digests: dict[str, Any] | None = None
        """The final state's digests (trainer/digest/state_hash.py), on rank 0 once `loop` finished; else
        None."""
        self.last_step = -1

    # What the training function may read.
    @property
    def entries(self) -> dict[str, Any]:
        """What the checkpoints hold, by name (model, optim, trainer, scheduler, the team's state); held
        by the session alone, so its teardown drops the last reference to the model and its groups."""
        return self._session.entries

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
        """This pod's group rank (the launcher's node index)."""
        return self._proc.node

    @property
    def device(self) -> torch.device:
        assert self._session.device is not None
        return self._session.device

    @property
    def mesh(self) -> Any:
        """The 1-D DeviceMesh over every rank, for `fully_shard(..., mesh=job.mesh)`."""
        return self._session.mesh

    @property
    def seed(self) -> int:
        return self._cfg.run.seed

    @property
    def steps(self) -> int:
        """Global steps of the whole run; `loop` stops there."""
        return self._cfg.run.steps

    @property
    def args(self) -> tuple[str, ...]:
        """The entry point's own arguments: everything after `--` (chart value `entrypointArgs`)."""
        return self._cfg.run.entry_args

    @property
    def out_dir(self) -> Path:
        return self._cfg.run.out_dir

    @property
    def config(self) -> TrainConfig:
        """The library's whole configuration (timeouts, checkpoints, snapshots, ...), read-only."""
        return self._cfg

    @property
    def attempt(self) -> int:
        """0 in a new process, 1, 2, ... for each in-process restart (tier 1) in the same process."""
        return int(self._call_wrapper.iteration) if self._call_wrapper is not None else 0

    def device_mesh(self, shape: tuple[int, ...], names: tuple[str, ...]) -> Any:
        """A DeviceMesh of more dimensions (HSDP, TP) that the library knows and tears down in a restart."""
        return self._session.extra_mesh(shape, names)

    def log(self, loss: torch.Tensor | float, *, tokens: int | None = None) -> None:
        """This step's loss: its mean over the ranks goes into the step event (and the live metrics).

        `tokens`: this rank's tokens in the step, when the batch does not say (see `_tokens`)."""
        self._loss = loss.detach() if isinstance(loss, torch.Tensor) else torch.tensor(float(loss))
        self._tokens = tokens

    def loop(
        self,
        *,
        model: torch.nn.Module,
        optimizer: torch.optim.Optimizer,
        data: Any,
        scheduler: Any = None,
        state: Mapping[str, Any] | None = None,
        allow_unsaved_data: bool = False,
    ) -> Iterator[tuple[int, Any]]:
        """Restore, then yield `(step, batch)` for every remaining step; the body is the team's step.

        `data` is an iterator (or iterable) of batches whose position can be saved (`state_dict` and
        `load_state_dict`, e.g. `api.SampleCursor`), or a DataLoader over a DistributedSampler (the loop
        sets its epochs and saves its position); one batch is drawn per step, after the restore.
        `scheduler` and the entries of `state` (EMA weights, a grad scaler, counters: anything with
        state_dict/load_state_dict) are checkpointed, snapshotted and restored with the model. Checked
        before the first step: misuse raises `Misuse`, one line naming the rule and the fix.
        """
        spans.mark("build")  # the training function's own work before the loop: model, optimizer, data
        if self._looped:
            raise misuse.Misuse("job.loop", "called twice in one attempt: run every step in one loop")
        self._looped = True
        misuse.check_model(model)
        misuse.check_optimizer(optimizer, model)
        data, position_saved = misuse.check_data(data, allow_unsaved=allow_unsaved_data)
        extra = misuse.check_state(scheduler, state)
        misuse.check_groups(self._session.known_groups)
        loop_state = LoopState(data if position_saved else None, self.device)
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
        return self._steps(entries, loop_state, data)  # checked now, at the call, not at the first next()

    def _steps(self, entries: dict[str, Any], loop_state: LoopState, data: Any) -> Iterator[tuple[int, Any]]:
        from trainer.recovery.restore import restore_attempt

        s, events, faults, cfg = self._session, self._events, self._faults, self._cfg
        restored = restore_attempt(self._snapshots, s.ckpt, entries, self.device, events).step
        if restored >= 0 and loop_state.step != restored:
            raise RuntimeError(f"checkpoint of step {restored} holds trainer step {loop_state.step}")
        self._heartbeat.start()
        batches = data if hasattr(data, "__next__") else iter(data)  # iter() after the restore: its position
        loss_buf = torch.zeros(1, device=self.device)
        for step in range(loop_state.step + 1, cfg.run.steps):
            faults.at_step(step, corrupt_newest=lambda: corrupt_newest(s))
            t_start = time.time()
            try:
                batch = next(batches)
            except StopIteration:
                raise misuse.Misuse(
                    "data", f"ran out of batches at step {step} of {cfg.run.steps}: make it endless (epochs)"
                ) from None
            self._loss, self._tokens = None, None
            yield step, batch
            logged = self._loss is not None
            if self._loss is not None:
                loss_buf.copy_(self._loss.to(loss_buf.device, torch.float32).reshape(1))
            else:
                loss_buf.zero_()
            dist.all_reduce(loss_buf)  # mean loss over ranks for the log (and a per-step liveness check)
            loop_state.step = self.last_step = step
            t_end = time.time()
            if self.rank == 0:
                events.emit(
                    "step",
                    step=step,
                    t_start=t_start,
                    t_end=t_end,
                    loss=loss_buf.item() / self.world_size if logged else math.nan,
                    tokens=_tokens(batch, self.world_size)
                    if self._tokens is None
                    else self._tokens * self.world_size,
                )
            snap = self._snapshots.after_step(step, entries)
            if snap is not None:
                events.emit(
                    "snapshot", step=step, blocked_s=snap.blocked_s, copy_s=snap.copy_s, bytes=snap.bytes
                )
            self._heartbeat.beat()
            self.ping()
            s.ckpt.after_step(step, entries, snap.reusable if snap is not None else None)
            self.ping()  # a save that blocked is progress too: each wait gets the whole soft timeout
        self._heartbeat.pause()  # no more steps: the final commit and the run's end: the static timeout
        # The final state's digest (a collective) while the final save writes in the background: the run's
        # tail is the longer of the two, not their sum (the save's agreement has its own group).
        self.final_digests = state_digests(entries)
        self.ping()  # the full-state gather and hash may take long on a big model
        s.ckpt.finish(entries)  # run_end follows only once the last step is committed
        self.ping()
        self.last_step = loop_state.step
        self.finished = True

    def ping(self) -> None:
        """Tell the in-process Wrapper that this rank made progress (its soft timeout counts from here).

        The loop calls it after each phase that may block for long (a step, a save, the final commit);
        a training function that does long work outside the loop (an evaluation) should call it too.
        """
        ping(self._call_wrapper)


def ping(call_wrapper: Any) -> None:
    """Progress for the in-process Wrapper's soft timeout (None: tier 1 off)."""
    if call_wrapper is not None:
        call_wrapper.ping()


def _tokens(batch: Any, world_size: int) -> int:
    """Tokens in this step across ranks, when the batch says: an (inputs, targets) pair or a dict with
    `input_ids` of integer ids (0 otherwise: pass `tokens=` to `job.log`)."""
    first = batch[0] if isinstance(batch, tuple | list) and batch else batch
    if isinstance(first, Mapping):
        first = first.get("input_ids")
    if isinstance(first, torch.Tensor) and not first.is_floating_point():
        return int(first.numel()) * world_size
    return 0


def corrupt_newest(s: Session) -> None:
    """ckpt-corrupt: make the newest committed checkpoint unreadable (flip bytes in its largest file),
    in both tiers: the node-local copy of that file too, if this node has it."""
    # No wait() here: it is collective and only the faulting rank is in this function.
    newest = s.ckpt.latest_committed_path()
    if newest is None:
        return
    files = sorted((p for p in Path(newest).rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    if not files:
        return
    targets = [files[-1]]
    local = s.ckpt.manager.local
    if local is not None:
        targets.append(local.root / Path(newest).name / files[-1].name)
    for target in targets:
        if target.is_file():
            _flip_middle(target)


def _flip_middle(path: Path) -> None:
    with open(path, "r+b") as fh:
        size = path.stat().st_size
        fh.seek(size // 2)
        chunk = fh.read(64)
        fh.seek(size // 2)
        fh.write(bytes(b ^ 0xFF for b in chunk))
        fh.flush()
        os.fsync(fh.fileno())
