"""`Job`: what the library hands a training function once per attempt, as a typed, read-only view.

One attempt is one call of the team's function: the first in a process, and again in the same process
after each in-process restart (tier 1). The library has built the process group and `job.mesh` before
the call and tears both down after it, whatever the function does. Inside, `job.loop(...)` is the whole
contract: it checks what it is given (trainer/api/misuse.py), restores the newest state every rank has
(memory, /dev/shm, a peer's replica, NVMe, FSx), then yields `(step, batch)` for each remaining step and,
at each step boundary the body hands back, records the step, snapshots, beats and saves.

This module holds only the contract: `Job` is abstract (the runtime's `RunningJob`, trainer/runtime/job.py,
implements it), `JobConfig` is the part of the library's configuration a function may read, and
`StatefulData` is what a data source needs for its position to survive a restart.

Step numbering (shared with the event log and the checkpoints): steps are 0-based; a checkpoint is
labelled with the last step it includes; a run resumes at `restored.step + 1` (-1 = nothing restored).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar, runtime_checkable

import torch
from torch.distributed.checkpoint.stateful import Stateful
from torch.distributed.device_mesh import DeviceMesh

Batch = TypeVar("Batch")
Batch_co = TypeVar("Batch_co", covariant=True)

TrainFn = Callable[["Job"], object]
"""A training function: called with the `Job` once per attempt (trainer/api/__init__.py)."""


@runtime_checkable
class StatefulData(Protocol[Batch_co]):
    """A data source whose position the library saves and restores with the model: one batch per
    `next()`, and the position as a state dict of tensors, numbers, strings and lists/dicts of them
    (`api.SampleCursor` is one; a DataLoader over a DistributedSampler is wrapped into one)."""

    def __next__(self) -> Batch_co: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass(frozen=True)
class JobConfig:
    """What a training function (and its `checked_by` check) may read of the library's configuration."""

    entrypoint: str
    """The function the run calls, `module:function` (`--entrypoint`, chart `entrypoint`)."""
    args: tuple[str, ...]
    """The entry point's own arguments: everything after `--` (chart `entrypointArgs`)."""
    steps: int
    """Global steps of the whole run; `job.loop` stops there."""
    seed: int
    """The run's seed (the library seeds Python, NumPy and torch from it and the rank)."""
    out_dir: Path
    """Where the run writes its events and summary; a function may write its own files there."""
    device: str
    """The device asked for: auto, cpu or cuda (`job.device` is the one chosen)."""
    ckpt_interval: int
    """A durable checkpoint after every this many steps (and the last)."""
    snapshot_interval: int
    """An in-memory snapshot after every this many steps (0: off)."""


class Job(ABC):
    """The job as one attempt of the training function sees it: read-only, but for `loop`, `log` and
    `ping`."""

    @property
    @abstractmethod
    def config(self) -> JobConfig:
        """The run's settings a function may read."""

    @property
    @abstractmethod
    def rank(self) -> int: ...

    @property
    @abstractmethod
    def world_size(self) -> int: ...

    @property
    @abstractmethod
    def local_rank(self) -> int: ...

    @property
    @abstractmethod
    def node(self) -> int:
        """This pod's group rank (the launcher's node index)."""

    @property
    @abstractmethod
    def device(self) -> torch.device:
        """The device this rank trains on (cuda:<local rank> or cpu)."""

    @property
    @abstractmethod
    def mesh(self) -> DeviceMesh:
        """The 1-D DeviceMesh over every rank, for `fully_shard(..., mesh=job.mesh)`."""

    @property
    @abstractmethod
    def attempt(self) -> int:
        """0 in a new process, 1, 2, ... for each in-process restart (tier 1) in the same process."""

    @property
    @abstractmethod
    def entries(self) -> Mapping[str, object]:
        """What the checkpoints hold, by name (model, optim, trainer, scheduler, the team's state): empty
        before `loop`."""

    @property
    @abstractmethod
    def finished(self) -> bool:
        """True once `loop` ran its last step and the final save committed."""

    @property
    def seed(self) -> int:
        return self.config.seed

    @property
    def steps(self) -> int:
        """Global steps of the whole run; `loop` stops there."""
        return self.config.steps

    @property
    def args(self) -> tuple[str, ...]:
        """The entry point's own arguments: everything after `--` (chart value `entrypointArgs`)."""
        return self.config.args

    @property
    def out_dir(self) -> Path:
        return self.config.out_dir

    @abstractmethod
    def device_mesh(self, shape: tuple[int, ...], names: tuple[str, ...]) -> DeviceMesh:
        """A DeviceMesh of more dimensions (HSDP, TP) that the library knows and tears down in a restart."""

    @abstractmethod
    def log(self, loss: torch.Tensor | float, *, tokens: int | None = None) -> None:
        """This step's loss: its mean over the ranks goes into the step event (and the live metrics).

        `tokens`: this rank's tokens in the step, when the batch does not say (an (inputs, targets) pair
        or a dict with `input_ids` of integer ids does)."""

    @abstractmethod
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
        """Restore, then yield `(step, batch)` for every remaining step; the body is the team's step.

        `data` is a `StatefulData` (e.g. `api.SampleCursor`), or a DataLoader over a DistributedSampler
        (the loop sets its epochs and saves its position); one batch is drawn per step, after the
        restore. `scheduler` and the entries of `state` (EMA weights, a grad scaler, counters: anything
        with state_dict/load_state_dict) are checkpointed, snapshotted and restored with the model.
        Checked at the call: misuse raises `Misuse`, one line naming the rule and the fix.
        """

    @abstractmethod
    def ping(self) -> None:
        """Tell the in-process Wrapper that this rank made progress (its soft timeout counts from here).

        The loop calls it after each phase that may block for long (a step, a save, the final commit);
        a training function that does long work outside the loop (an evaluation) should call it too.
        """
