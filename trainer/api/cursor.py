"""`SampleCursor`: any map-style dataset as a data source whose position can be saved.

A team's `torch.utils.data.DataLoader` with a `DistributedSampler` cannot say where it is, so a resume
would start its epoch over (repeating data) or the team would skip ahead by hand. `SampleCursor` draws
the same batches deterministically from a dataset with `__len__` and `__getitem__` and keeps one number,
the global sample position: each step every rank takes `batch_size` samples of one shuffled order
(reshuffled per epoch from the seed), so the position survives any restart, and a resume on another
world size continues at the same sample instead of replaying or skipping (as the reference model's
token cursor does).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
from torch.utils.data import default_collate

if TYPE_CHECKING:
    from trainer.api.job import Job


class MapDataset(Protocol):
    def __len__(self) -> int: ...
    def __getitem__(self, index: int) -> Any: ...


class SampleCursor:
    """Batches of `dataset` for this rank, step by step; `state_dict` is the global sample position."""

    def __init__(
        self,
        dataset: MapDataset,
        batch_size: int,
        *,
        job: Job | None = None,
        rank: int = 0,
        world_size: int = 1,
        seed: int = 0,
        shuffle: bool = True,
        collate: Callable[[list[Any]], Any] = default_collate,
    ) -> None:
        if job is not None:
            rank, world_size, seed = job.rank, job.world_size, job.seed
        if batch_size < 1:
            raise ValueError(f"batch_size: must be >= 1, got {batch_size}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank: must be in [0, world_size={world_size}), got {rank}")
        self.size = len(dataset)
        if self.size < 1:
            raise ValueError("dataset: is empty")
        self.dataset, self.batch_size, self.collate = dataset, batch_size, collate
        self.rank, self.world_size, self.seed, self.shuffle = rank, world_size, seed, shuffle
        self.position = 0
        """Samples every rank together has consumed (global)."""
        self._epoch, self._order = -1, np.empty(0, dtype=np.int64)

    def _index(self, sample: int) -> int:
        epoch, k = divmod(sample, self.size)
        if not self.shuffle:
            return k
        if epoch != self._epoch:
            self._order = np.random.default_rng([self.seed, epoch]).permutation(self.size)
            self._epoch = epoch
        return int(self._order[k])

    def __iter__(self) -> SampleCursor:
        return self

    def __next__(self) -> Any:
        first = self.position + self.rank * self.batch_size
        batch = self.collate([self.dataset[self._index(first + j)] for j in range(self.batch_size)])
        self.position += self.world_size * self.batch_size
        return batch

    def state_dict(self) -> dict[str, Any]:
        return {"position": self.position, "seed": self.seed, "size": self.size}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if int(state["seed"]) != self.seed or int(state["size"]) != self.size:
            raise ValueError(
                f"data: the checkpoint's cursor has seed {state['seed']} over {state['size']} samples, "
                f"this run has seed {self.seed} over {self.size}"
            )
        self.position = int(state["position"])
