"""The `checked_by` contract: a training function's check of its own inputs (its arguments, its data
files), run with the library's preflight, with the types it takes (`JobConfig`, `World`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from trainer.api.job import JobConfig, TrainFn

CHECK_ATTR = "__trainer_check__"


@dataclass(frozen=True)
class World:
    """The job's size as far as the environment tells it (None: unknown here, e.g. in the chart's
    check-config init container with hot spares)."""

    world_size: int | None
    nnodes: int | None
    source: str
    """Where the size came from: WORLD_SIZE, NNODES x NPROC_PER_NODE, or unknown."""


CheckFn = Callable[[JobConfig, World], None]
"""A training function's check of its own inputs: raise `api.ConfigError(field, why)` for one clear line."""


def checked_by(check: CheckFn) -> Callable[[TrainFn], TrainFn]:
    """Decorate a training function with a check of its own inputs (its arguments, its data files), run
    with the library's preflight: in the `check-config` init container (exit 2) and at every worker's
    start (exit 93). `check(config, world)` gets the run's `JobConfig` (`config.args` are the function's
    own arguments) and the `World`; raise `api.ConfigError(field, why)` for one clear line."""

    def mark(fn: TrainFn) -> TrainFn:
        setattr(fn, CHECK_ATTR, check)
        return fn

    return mark


def entry_check(fn: TrainFn) -> CheckFn | None:
    """The check `checked_by` attached to `fn`, if any."""
    check = getattr(fn, CHECK_ATTR, None)
    return check if callable(check) else None
