"""A team's own `DataLoader` over a `DistributedSampler`, with a position that can be saved.

A DistributedSampler's order is a function of its seed and epoch alone, so the loader's position is two
numbers: the epoch and the batches drawn in it. `LoaderCursor` keeps both, sets the epoch itself at each
epoch's start (the team's `sampler.set_epoch(epoch)` loop moves into it) and, on a resume, skips the
drawn batches' indices in the sampler without loading their samples. `job.loop` wraps such a loader by
itself; a loader whose order it cannot reproduce (a RandomSampler without a seeded generator, an
IterableDataset) is refused with the rule (trainer/api/misuse.py).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler


class _Skipping:
    """A sampler that drops the first `skip` indices of its next pass (then passes everything)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.skip = 0

    def __iter__(self) -> Iterator[Any]:
        it, skip, self.skip = iter(self.inner), self.skip, 0
        for _ in range(skip):
            if next(it, _END) is _END:
                return
        yield from it

    def __len__(self) -> int:
        return len(self.inner)

    def set_epoch(self, epoch: int) -> None:
        self.inner.set_epoch(epoch)


_END = object()


def resumable(loader: Any) -> bool:
    """True for a DataLoader whose batches `LoaderCursor` can reproduce: a map-style dataset drawn by a
    BatchSampler over a DistributedSampler (its order depends on seed and epoch only)."""
    if not isinstance(loader, DataLoader):
        return False
    batches = loader.batch_sampler
    return isinstance(batches, BatchSampler) and isinstance(
        getattr(batches, "sampler", None), DistributedSampler | _Skipping
    )


class LoaderCursor:
    """Batches of `loader`, epoch after epoch; `state_dict` is (epoch, batches drawn in the epoch)."""

    def __init__(self, loader: DataLoader[Any]) -> None:
        if not resumable(loader):
            raise TypeError("LoaderCursor needs a DataLoader over a DistributedSampler")
        batches = loader.batch_sampler
        assert isinstance(batches, BatchSampler)
        if not isinstance(batches.sampler, _Skipping):
            batches.sampler = _Skipping(batches.sampler)
        self.loader, self.skipping = loader, batches.sampler
        self.batch_size = batches.batch_size
        self.epoch, self.drawn = 0, 0
        self._it: Iterator[Any] | None = None

    def _start(self) -> None:
        self.skipping.set_epoch(self.epoch)
        self.skipping.skip = self.drawn * self.batch_size
        # A DataLoader's iterator draws its workers' base seed from torch's global generator (unless the
        # loader has its own): a resume starts one more iterator than the run it replaces, and would
        # shift every later dropout mask. The draw is kept off the global stream.
        state = torch.get_rng_state()
        self._it = iter(self.loader)
        torch.set_rng_state(state)

    def __iter__(self) -> LoaderCursor:
        return self

    def __next__(self) -> Any:
        if self._it is None:
            self._start()
        assert self._it is not None
        batch = next(self._it, _END)
        if batch is _END:  # the epoch is over: the next one, in its own order
            self.epoch, self.drawn = self.epoch + 1, 0
            self._start()
            batch = next(self._it, _END)
            if batch is _END:
                raise StopIteration
        self.drawn += 1
        return batch

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "drawn": self.drawn, "batch_size": self.batch_size}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if int(state["batch_size"]) != self.batch_size:
            raise ValueError(
                f"data: the checkpoint's loader drew batches of {state['batch_size']}, this one of "
                f"{self.batch_size}"
            )
        self.epoch, self.drawn = int(state["epoch"]), int(state["drawn"])
        self._it = None  # the next batch starts the epoch over, skipping what was drawn
