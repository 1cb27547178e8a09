"""The numerical guard: a step whose loss or gradient norm is corrupt is rolled back, never kept.

A silent data corruption (a bad GPU, a flipped bit) or a loss spike does not stop anything: it is trained
on, snapshotted and then restored by every tier. The guard checks every step on every rank, after the
team's step and before anything of it is kept (the step event, the snapshot, the checkpoint):

- **What each rank checks** (`local_finding`): the loss it passed to `job.log` and the norm of its local
  gradients, taken in the optimizer's step (a step pre-hook: the only moment the library sees them; after
  the step the team zeroes them). A value that is not finite trips it, and so does a value past
  `spike_factor` x the median of the last `window` values this rank kept (checked once the window is
  full, so the first, falling steps of a run never compare against too few).
- **How the ranks agree** (`pack`/`unpack`): the finding is folded into the one all_reduce the loop
  already makes per step (the loss mean): [loss, tripped, sum of tripped ranks, grad norm^2] instead of
  [loss], so the verdict costs no collective of its own and every rank reads the same one. A NaN on one
  rank rolls back every rank.
- **What a trip does** (trainer/runtime/job.py): the step is not recorded, snapshotted or saved; every
  rank restores the newest state every rank has (trainer/recovery/restore.py, the same agreement a
  restart uses: the in-memory snapshot, else the checkpoint) and replays from there, skipping the batch
  of the tripped step: the step is run again on the next batch.
- **What makes it reproducible** (`SkipRecord`): the skipped batches are recorded in
  `<out-dir>/guard/skipped.json` (rank 0, atomically, before the rollback's restore), read by every
  process that starts on the run: a resume from a state older than the skip skips the same batch, and a
  run that starts with the record skips it from the start and ends in the same state. The guard's
  windows are part of the library's checkpoint entry, so a resumed run judges every later step as the
  uninterrupted run did.
- **Repeated corruption on one rank** (`Guard.tripped`): `suspect_trips` trips on the same rank mark its
  node suspect (trainer/resilience/suspect.py: an event, a metric and the hook an eviction uses).
"""

from __future__ import annotations

import json
import math
import os
import statistics
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trainer.config.settings import ConfigError, check, setting


@dataclass(frozen=True)
class GuardConfig:
    """The numerical guard's settings (docs/bring-your-own.md, "The numerical guard")."""

    enabled: bool = setting(
        "--guard", "check each step's loss and gradient norm; roll a corrupt step back", default=True,
        chart="guard",
    )  # fmt: skip
    """Off: the step's loss is reduced alone, as without a guard; nothing is checked."""
    spike_factor: float = setting(
        "--guard-spike-factor",
        "a loss or gradient norm past this many times its recent median trips the guard",
        default=10.0,
        above=1,
        chart="guardSpikeFactor",
    )
    """Loss spikes of LLM training are a few times the median; a corrupt step's are orders of magnitude."""
    window: int = setting(
        "--guard-window",
        "steps in the recent median (spikes are checked once it is full)",
        default=50,
        low=3,
        high=100_000,
        chart="guardWindow",
    )
    suspect_trips: int = setting(
        "--guard-suspect-trips",
        "trips on the same rank that mark its node suspect",
        default=2,
        low=1,
        high=1000,
        chart="guardSuspectTrips",
    )

    def __post_init__(self) -> None:
        check(self)


# ------------------------------------------------------------------------------------------- the rules
def median(values: Iterable[float]) -> float | None:
    vals = list(values)
    return statistics.median(vals) if vals else None


def spike(value: float, history: Iterable[float], factor: float, window: int) -> bool:
    """`value` is past `factor` x the median of `history`, once `history` holds `window` values."""
    vals = list(history)
    if len(vals) < window:
        return False
    m = statistics.median(vals)
    return m > 0 and value > factor * m


def local_finding(
    loss: float | None, grad_norm: float | None, windows: Windows, cfg: GuardConfig
) -> str | None:
    """Why this rank's step trips the guard, or None: a non-finite loss or gradient norm, or a spike.
    None stands for a value the step did not give (no `job.log`, no optimizer step seen)."""
    for name, value, history in (("loss", loss, windows.loss), ("grad_norm", grad_norm, windows.grad)):
        if value is None:
            continue
        if not math.isfinite(value):
            return f"{name} is {value}"
        if spike(value, history, cfg.spike_factor, cfg.window):
            return f"{name} {value:.4g} > {cfg.spike_factor:g} x median {median(history):.4g}"
    return None


@dataclass
class Windows:
    """This rank's recent kept losses and gradient norms: part of the library's checkpoint entry."""

    size: int
    loss: deque[float] = field(init=False)
    grad: deque[float] = field(init=False)

    def __post_init__(self) -> None:
        self.loss, self.grad = deque(maxlen=self.size), deque(maxlen=self.size)

    def keep(self, loss: float | None, grad_norm: float | None) -> None:
        """A step that passed: its values join the medians (the oldest leaves a full window)."""
        for values, value in ((self.loss, loss), (self.grad, grad_norm)):
            if value is not None:
                values.append(float(value))

    def state_dict(self) -> dict[str, Any]:
        return {"loss": list(self.loss), "grad": list(self.grad)}

    def load_state_dict(self, state: Mapping[str, Any] | None) -> None:
        state = state or {}
        # A smaller window than the checkpoint's keeps the newest values.
        self.loss = deque((float(v) for v in state.get("loss", [])), maxlen=self.size)
        self.grad = deque((float(v) for v in state.get("grad", [])), maxlen=self.size)


@dataclass(frozen=True)
class Verdict:
    """What the all_reduce told every rank alike."""

    loss_sum: float
    """The sum over ranks of the logged losses (the step event's loss is its mean)."""
    tripped: int
    """How many ranks tripped (0: the step passed)."""
    rank_sum: int
    """The sum of the tripped ranks (the rank itself when one tripped)."""
    grad_sq: float
    """The sum over ranks of their local gradient norms squared (the global norm^2 of sharded grads)."""

    @property
    def ok(self) -> bool:
        return self.tripped == 0

    def ranks(self, gathered: list[int] | None = None) -> list[int]:
        """The tripped ranks: known from the sums when one tripped; else from `gathered` (each rank's
        flag, a second collective made only then)."""
        if self.tripped == 1:
            return [self.rank_sum]
        return [r for r, flag in enumerate(gathered or []) if flag]


PACKED = 4
"""Values per rank in the step's all_reduce with the guard on: loss, tripped, tripped rank, grad norm^2."""


def pack(loss: float, finding: str | None, rank: int, grad_norm: float | None) -> list[float]:
    tripped = 1.0 if finding is not None else 0.0
    grad_sq = 0.0 if grad_norm is None or not math.isfinite(grad_norm) else grad_norm * grad_norm
    return [loss if math.isfinite(loss) else 0.0, tripped, tripped * rank, grad_sq]


def unpack(values: list[float]) -> Verdict:
    return Verdict(values[0], round(values[1]), round(values[2]), values[3])


# ----------------------------------------------------------------------------------- the skip record
RECORD = "guard/skipped.json"
"""Under the run's output directory: the batches skipped and the trips per rank (Contract 3)."""


@dataclass
class SkipRecord:
    """The skipped batches (how many at each step) and the trips per rank, of the whole run."""

    skips: dict[int, int] = field(default_factory=dict)
    trips: dict[int, int] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps(
            {
                "skips": {str(k): v for k, v in sorted(self.skips.items())},
                "trips": {str(k): v for k, v in sorted(self.trips.items())},
            },
            indent=1,
        )

    @classmethod
    def parse(cls, text: str, where: str) -> SkipRecord:
        """The record, checked field by field (ConfigError naming the field: no restart fixes it)."""
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError("guard_record", f"{where} is not JSON: {exc}") from None
        if not isinstance(raw, dict) or set(raw) - {"skips", "trips"}:
            raise ConfigError("guard_record", f"{where} must be an object with skips and trips")
        return cls(
            _counts(raw.get("skips", {}), f"{where} skips"), _counts(raw.get("trips", {}), f"{where} trips")
        )

    @classmethod
    def load(cls, out_dir: Path) -> SkipRecord:
        path = out_dir / RECORD
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return cls()
        return cls.parse(text, str(path))

    def save(self, out_dir: Path) -> None:
        """Atomically (a reader sees the old record or the new one), and durably before the rollback."""
        path = out_dir / RECORD
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(self.to_json())
            fh.flush()
            os.fsync(fh.fileno())
        tmp.replace(path)


def _counts(raw: object, where: str) -> dict[int, int]:
    if not isinstance(raw, dict):
        raise ConfigError("guard_record", f"{where} must be an object of step: count")
    out = {}
    for key, value in raw.items():
        if not (isinstance(key, str) and key.isascii() and key.isdigit()):
            raise ConfigError("guard_record", f"{where}: key {key!r:.40} is not a step or rank number")
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError("guard_record", f"{where}[{key}] must be an integer >= 1, got {value!r:.40}")
        out[int(key)] = value
    return out


# ---------------------------------------------------------------------------------------- the guard
@dataclass(frozen=True)
class Trip:
    """One agreed trip, as every rank saw it."""

    step: int
    ranks: list[int]
    suspects: list[int] = field(default_factory=list)
    """Ranks whose trips reached `suspect_trips` at this trip (each is reported once)."""


class Guard:
    """The guard of one process (it outlives in-process restarts): the config and the run's record."""

    def __init__(self, cfg: GuardConfig, out_dir: Path, *, rank: int) -> None:
        self.cfg, self.out_dir, self.rank = cfg, out_dir, rank
        self.record = SkipRecord.load(out_dir) if cfg.enabled else SkipRecord()

    @property
    def enabled(self) -> bool:
        return self.cfg.enabled

    def skips_at(self, step: int) -> int:
        """Batches to draw and drop before step `step`'s own (batches that tripped the guard there)."""
        return self.record.skips.get(step, 0)

    def tripped(self, step: int, ranks: list[int]) -> Trip:
        """Record the trip every rank agreed on: its batch skipped, a trip for each rank (rank 0 writes
        the record before anyone restores). Returns it with the ranks it makes suspect."""
        self.record.skips[step] = self.record.skips.get(step, 0) + 1
        suspects = []
        for r in ranks:
            self.record.trips[r] = self.record.trips.get(r, 0) + 1
            if self.record.trips[r] == self.cfg.suspect_trips:
                suspects.append(r)
        if self.rank == 0:
            self.record.save(self.out_dir)
        return Trip(step, list(ranks), suspects)
