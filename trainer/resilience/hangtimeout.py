"""The hang timeout measured from the step time: ft_launcher's heartbeat timeout, calculated per rank.

A hang is progress that stops, so it is judged against how long a step takes here, not against a
cluster-wide guess. The trainer beats ft_launcher's rank monitor once per step, after the step and any
snapshot, and the save of that step follows the beat: the interval between two beats is a whole step
including the time a snapshot or a save blocks it. After `warmup_steps` such intervals (at least one
full checkpoint interval, so a save is among them) the rank monitor's heartbeat timeout becomes

    timeout = min(ceiling, max(floor, factor x the longest interval seen))

which is NVRx's own rule for calculated timeouts (safety factor x the longest interval) bounded on both
sides: `floor` keeps a fast step (0.1 s on CPU) from making every hiccup a hang, and `ceiling` (the
static `--ft-rank-heartbeat-timeout`) keeps the calculated value from ever exceeding the static one that
was in force while it was measured. Until then, and while an in-process (tier 1) restart runs, the
static timeout stays in force. The value only grows during a process: a longer interval seen later
(a slower save) raises it, a shorter one never lowers it.

The calculated value is set through NVRx's RankMonitorClient state protocol (HeartbeatTimeouts with
were_calculated=True: trainer/resilience/nvrx_rank_monitor.py) and persisted in NVRx's state_dict
format, one file per rank, so a worker restarted by ft_launcher (or a replacement pod on the same output
directory) judges its steps against it from its first step on instead of warming up again.

Why not NVRx's calculate_and_set_hb_timeouts(): it has no floor or ceiling (a 0.1 s step would give a
0.5 s timeout), it counts the gap across a tier-1 restart as a step, it agrees across ranks with a
collective on the default process group inside the training loop, and it sets the initial timeout too,
which the rank monitor keeps for the next worker's start-up (the rank monitor outlives worker restarts).
"""

from __future__ import annotations

import json
import logging
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

STATE_DIR = "hang-timeouts"
"""Under the run's output directory: one NVRx RankMonitorClient state file per rank."""


@dataclass(frozen=True)
class HangPolicy:
    """How the calculated hang timeout is derived (the module docstring has the rule)."""

    floor_s: float
    """The calculated timeout is never shorter (seconds), unless the ceiling is (then it is the ceiling)."""
    factor: float
    """Multiplier on the longest beat interval seen (a step including snapshot and save)."""
    warmup_steps: int
    """Beat intervals measured before the calculated timeout replaces the static one."""
    ceiling_s: float
    """The static heartbeat timeout (--heartbeat-timeout = --ft-rank-heartbeat-timeout): never exceeded."""
    state_path: Path | None = None
    """Where this rank persists the calculated value (None: not persisted)."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.floor_s) and self.floor_s > 0):
            raise ValueError(f"floor_s: must be > 0, got {self.floor_s}")
        if not (math.isfinite(self.ceiling_s) and self.ceiling_s > 0):
            raise ValueError(f"ceiling_s: must be > 0, got {self.ceiling_s}")
        if not (math.isfinite(self.factor) and self.factor > 1):
            raise ValueError(f"factor: must be > 1, got {self.factor}")
        if self.warmup_steps < 1:
            raise ValueError(f"warmup_steps: must be >= 1, got {self.warmup_steps}")

    def timeout(self, longest_interval_s: float) -> float:
        """The hang timeout for steps that took at most `longest_interval_s` (seconds)."""
        return min(self.ceiling_s, max(self.floor_s, self.factor * longest_interval_s))

    def clamp(self, timeout_s: float) -> float:
        """A timeout from elsewhere (an earlier run's file), within today's floor and ceiling."""
        return min(self.ceiling_s, max(self.floor_s, timeout_s))


def effective_warmup(warmup_steps: int, ckpt_interval: int, snapshot_interval: int = 0) -> int:
    """Beats to measure before calculating: `warmup_steps`, stretched so the intervals include a save
    (and a snapshot when they are on): the first save after a (re)start follows at most `ckpt_interval`
    steps, and the interval that contains it ends one beat later. 0 when warmup_steps is 0 (off)."""
    if warmup_steps <= 0:
        return 0
    return max(warmup_steps, ckpt_interval + 1, snapshot_interval + 1 if snapshot_interval > 0 else 0)


def policy_from_config(cfg: Any, rank: int) -> HangPolicy | None:
    """The policy of a TrainConfig (None when --hang-warmup-steps is 0: the static timeout stays)."""
    t = cfg.timeouts
    warmup = effective_warmup(t.hang_warmup_steps, cfg.ckpt.interval_steps, cfg.snapshot.interval_steps)
    if warmup == 0:
        return None
    return HangPolicy(
        floor_s=t.hang_timeout_floor,
        factor=t.hang_timeout_factor,
        warmup_steps=warmup,
        ceiling_s=t.heartbeat_timeout,
        state_path=Path(cfg.run.out_dir) / STATE_DIR / f"rank{rank}.json",
    )


class StepIntervals:
    """The intervals between beats of this process, one training iteration at a time.

    `restart()` drops the baseline: the gap across a tier-1 restart (teardown, barrier, restore) is not
    a step. Counts and the longest interval accumulate over the process's iterations.
    """

    def __init__(self) -> None:
        self._last: float | None = None
        self.count = 0
        self.longest = 0.0

    def observe(self, now: float) -> None:
        if self._last is not None:
            self.count += 1
            self.longest = max(self.longest, now - self._last)
        self._last = now

    def restart(self) -> None:
        self._last = None


def load_timeout(path: Path | None) -> float | None:
    """The calculated subsequent-heartbeat timeout persisted at `path` (NVRx state_dict JSON), or None."""
    if path is None:
        return None
    from trainer.resilience.nvrx_rank_monitor import heartbeat_timeout_from_state

    try:
        state = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:  # torn or foreign file: measure again instead of failing
        log.warning("hang timeout: ignoring %s: %s", path, exc)
        return None
    value = heartbeat_timeout_from_state(state)
    return value if value is not None and math.isfinite(value) and value > 0 else None


def save_state(path: Path, state: dict[str, Any]) -> None:
    """Write the client's state (atomically: a restarted worker may read it at any moment)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(state, sort_keys=True))
    tmp.replace(path)
