"""Every timeout and port of the trainer, in one place, checked to nest.

Recovery is layered: the fastest mechanism must give up before the next, slower one acts, or a slow tier
kills work that a fast tier would have saved. From inner to outer:

    collective_timeout          a gloo/NCCL collective gives up (the PG's own timeout)
      < inprocess_soft_timeout  tier 1: a rank without progress is aborted and restarted in-process
      < inprocess_hard_timeout  tier 1: that rank is terminated (SIGTERM, then SIGKILL)
      < inprocess_barrier_timeout  tier 1: ranks wait this long for each other between iterations
      < heartbeat_timeout       tier 2: ft_launcher declares a rank hung and restarts all workers

Liveness is apart from that chain: `inprocess_liveness_timeout` is how long the Wrapper's monitor processes
(one per rank, beating every second from their own process, whatever the step time) wait for a missing
peer before declaring it dead. A node that vanishes without closing its sockets is noticed this way, so
it is short (DEFAULT_LIVENESS_TIMEOUT by default, so a lost node is noticed within that plus one
heartbeat interval), only bounded by one heartbeat
interval below and by `inprocess_hard_timeout` above (beyond it the hard timeout acts first).

`heartbeat_timeout` here must equal the launcher's `--ft-rank-heartbeat-timeout` (the chart renders both
from one value).

Progress in steady state: the chain above is what holds at start-up and during every tier-1 restart.
Once a rank has measured its step time (`hang_warmup_steps` steps, stretched to include a save), its
launcher heartbeat timeout becomes min(heartbeat_timeout, max(hang_timeout_floor, hang_timeout_factor x
the longest step including saves)) (trainer/resilience/hangtimeout.py). A rank without progress for that
long is restarted by ft_launcher (tier 2) even when it is shorter than the tier-1 timeouts: a hang costs a
worker restart, not minutes of waiting. Exceptions and lost nodes still reach tier 1 first, because the
heartbeat puts the static `heartbeat_timeout` back the moment an iteration fails (`Heartbeat.pause`)
and `hang_timeout_floor` must exceed the liveness timeout, so a lost node is noticed (and the restart
begun) before the calculated timeout can act on the survivors.

Lower bounds that no check here can know: the loop pings the Wrapper and beats the launcher heartbeat
once per step, so `inprocess_soft_timeout` (and so every outer timeout) must exceed the longest step
including the time a save blocks it (a whole write in `--ckpt-mode sync`, the first NVRx save that starts
its worker), and `collective_timeout` must exceed the longest wait of a healthy rank for a slow one. A
restore happens before the first ping of an iteration and is covered by the Wrapper's automatic
progress timestamps, and for tier 2 by the launcher's `--ft-initial-rank-heartbeat-timeout`, which
must cover start-up (imports, process group, model build, checkpoint load); the trainer never sees it.

The Wrapper's internal intervals are derived here from these values, so the CLI exposes only the
timeouts above. The intervals are short because on CPU with gloo the Wrapper's polling is the main cost
of a tier-1 restart (see docs in trainer/resilience/inprocess.py); they can be raised at scale with the
env knobs below.

Ports (the chart must open them between pods, the local runner must keep them free):

    MASTER_PORT       the launcher's rendezvous/agent store (ft_launcher/torchrun own it)
    MASTER_PORT + 1   the training process group's TCPStore, hosted by global rank 0 (TRAINER_PG_PORT)
    MASTER_PORT + 2   the in-process Wrapper's TCPStore, hosted by global rank 0 (TRAINER_INPROCESS_PORT)
    --metrics-port    Prometheus endpoint of local rank 0 on every node (0 = off; a taken port is skipped)

Why three stores: the launcher's store outlives worker restarts and carries its own keys; the PG's store
gets a fresh key prefix per restart iteration; the Wrapper's store must survive the PG being torn down.
Sharing a port makes rank 0 fail to bind or mixes keys across restarts. The host of both trainer stores
is MASTER_ADDR unless TRAINER_STORE_HOST is set (use the pod-0 service name when the launcher rewrites
MASTER_ADDR per pod).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta

from trainer.config.settings import WEEK_S, ConfigError, check, setting

PG_PORT_OFFSET = 1
INPROCESS_PORT_OFFSET = 2
DEFAULT_LIVENESS_TIMEOUT = 10.0
"""Seconds: a lost node is noticed within this plus one heartbeat interval (1 s)."""


class TimeoutNestingError(ValueError):
    """Raised when timeouts do not nest; `field` names the offending option."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


@dataclass(frozen=True)
class Timeouts:
    """All recovery timeouts in seconds. `check()` enforces the nesting documented above."""

    collective_timeout: float = setting(
        "--collective-timeout",
        "seconds",
        default=120.0,
        above=0,
        high=WEEK_S,
        unit=" seconds",
        chart="collectiveTimeout",
    )
    """Timeout of every collective of the training process group (gloo or NCCL)."""
    inprocess_soft_timeout: float = setting(
        "--inprocess-soft-timeout",
        "seconds",
        default=180.0,
        above=0,
        high=WEEK_S,
        unit=" seconds",
        chart="inprocessSoftTimeout",
    )
    """Tier 1: seconds without progress before a rank is aborted and restarted in-process."""
    inprocess_hard_timeout: float = setting(
        "--inprocess-hard-timeout",
        "seconds",
        default=300.0,
        above=0,
        high=WEEK_S,
        unit=" seconds",
        chart="inprocessHardTimeout",
    )
    """Tier 1: seconds without progress before a rank is terminated."""
    inprocess_barrier_timeout: float = setting(
        "--inprocess-barrier-timeout",
        "seconds",
        default=420.0,
        above=0,
        high=WEEK_S,
        unit=" seconds",
        chart="inprocessBarrierTimeout",
    )
    """Tier 1: how long ranks wait for each other at the Wrapper's barriers."""
    heartbeat_timeout: float = setting(
        "--heartbeat-timeout",
        "= ft_launcher --ft-rank-heartbeat-timeout",
        default=600.0,
        above=0,
        high=WEEK_S,
        unit=" seconds",
        chart="ftRankHeartbeatTimeout",
    )
    """Tier 2: ft_launcher's --ft-rank-heartbeat-timeout (must match the launcher flag)."""
    inprocess_liveness_timeout: float | None = setting(
        "--inprocess-liveness-timeout",
        "seconds without a peer's Wrapper heartbeat before it counts as dead (lost node); "
        "at most --inprocess-hard-timeout",
        default=DEFAULT_LIVENESS_TIMEOUT,
        kind=float,
        above=0,
        high=WEEK_S,
        unit=" seconds",
        chart="inprocessLivenessTimeout",
    )
    """Tier 1: seconds without a heartbeat from a peer's Wrapper monitor before that peer counts as dead;
    None: DEFAULT_LIVENESS_TIMEOUT, or inprocess_hard_timeout when that is shorter (a Timeouts built with
    tier-1 timeouts under 10 s passes None or a shorter value)."""
    hang_timeout_floor: float = setting(
        "--hang-timeout-floor",
        "seconds: the heartbeat timeout calculated from the measured step time is never shorter",
        default=60.0,
        above=0,
        high=WEEK_S,
        unit=" seconds",
        chart="hangTimeoutFloor",
    )
    """Tier 2, steady state: the calculated hang timeout is never shorter than this (seconds)."""
    hang_timeout_factor: float = setting(
        "--hang-timeout-factor",
        "the calculated heartbeat timeout is this times the longest step (saves included)",
        default=3.0,
        above=1,
        chart="hangTimeoutFactor",
    )
    """Tier 2, steady state: the calculated hang timeout is this times the longest step (incl. saves)."""
    hang_warmup_steps: int = setting(
        "--hang-warmup-steps",
        "steps measured (at least --ckpt-interval + 1) before the calculated heartbeat timeout "
        "replaces --heartbeat-timeout; 0 = never",
        default=20,
        low=0,
        high=10**6,
        chart="hangWarmupSteps",
    )
    """Steps measured before the calculated hang timeout replaces heartbeat_timeout (at least one
    checkpoint interval + 1, so a save is measured); 0 keeps heartbeat_timeout for the whole run.
    Bounds and nesting of every field: `check` (the chain above)."""

    def check(self) -> None:
        """Raise TimeoutNestingError naming the first field that is not positive or does not nest."""
        try:
            check(self)  # each one's declared bounds (positive, at most a week) before the nesting
        except ConfigError as exc:
            name, _, why = str(exc).removeprefix("config error: ").partition(": ")
            raise TimeoutNestingError(name, why) from None
        order = [
            ("collective_timeout", self.collective_timeout),
            ("inprocess_soft_timeout", self.inprocess_soft_timeout),
            ("inprocess_hard_timeout", self.inprocess_hard_timeout),
            ("inprocess_barrier_timeout", self.inprocess_barrier_timeout),
            ("heartbeat_timeout", self.heartbeat_timeout),
        ]
        for name, value in order:
            if not value > 0:
                raise TimeoutNestingError(name, f"must be > 0 seconds, got {value}")
        for (inner, inner_v), (outer, outer_v) in itertools.pairwise(order):
            if not inner_v < outer_v:
                raise TimeoutNestingError(
                    outer,
                    f"must be greater than {inner} ({inner_v} s) so the inner tier acts first, got {outer_v}",
                )
        if not self.heartbeat_interval < self.liveness_timeout <= self.inprocess_hard_timeout:
            raise TimeoutNestingError(
                "inprocess_liveness_timeout",
                f"must exceed the Wrapper heartbeat interval ({self.heartbeat_interval} s) and not exceed "
                f"inprocess_hard_timeout ({self.inprocess_hard_timeout} s), got {self.liveness_timeout}",
            )
        if not self.hang_timeout_floor > self.liveness_timeout:
            raise TimeoutNestingError(
                "hang_timeout_floor",
                f"must exceed the liveness timeout ({self.liveness_timeout} s) so a lost node is noticed "
                f"before the calculated hang timeout acts, got {self.hang_timeout_floor}",
            )
        if not self.hang_timeout_factor > 1:
            raise TimeoutNestingError("hang_timeout_factor", f"must be > 1, got {self.hang_timeout_factor}")
        if self.hang_warmup_steps < 0:
            raise TimeoutNestingError("hang_warmup_steps", f"must be >= 0, got {self.hang_warmup_steps}")
        if self.monitor_interval >= self.inprocess_soft_timeout:
            raise TimeoutNestingError("inprocess_soft_timeout", "must exceed the Wrapper monitor interval")

    # Derived Wrapper intervals (seconds). Short: detection latency is one interval on the monitor thread.
    @property
    def monitor_interval(self) -> float:
        """Monitor thread/process poll interval of the Wrapper (TRAINER_INPROCESS_MONITOR_INTERVAL)."""
        return float(os.environ.get("TRAINER_INPROCESS_MONITOR_INTERVAL", "0.1"))

    @property
    def liveness_timeout(self) -> float:
        """The Wrapper's heartbeat timeout in force (see inprocess_liveness_timeout)."""
        if self.inprocess_liveness_timeout is not None:
            return self.inprocess_liveness_timeout
        return min(DEFAULT_LIVENESS_TIMEOUT, self.inprocess_hard_timeout)

    @property
    def heartbeat_interval(self) -> float:
        """How often each Wrapper monitor process beats (liveness, independent of step time)."""
        return max(self.monitor_interval, 1.0)

    @property
    def last_call_wait(self) -> float:
        """How long the Wrapper waits for concurrent faults from other ranks before aborting."""
        return float(os.environ.get("TRAINER_INPROCESS_LAST_CALL_WAIT", "0.05"))

    def wrapper_kwargs(self) -> dict[str, timedelta]:
        """Keyword arguments for nvidia_resiliency_ext.inprocess.Wrapper (names valid in 0.4.1 and 0.7.x)."""
        td = timedelta
        interval = td(seconds=self.monitor_interval)
        return {
            "monitor_thread_interval": interval,
            "monitor_process_interval": interval,
            "progress_watchdog_interval": interval,
            "heartbeat_interval": td(seconds=self.heartbeat_interval),
            # Missing-rank detection between Wrapper monitor processes: liveness, not progress.
            "heartbeat_timeout": td(seconds=self.liveness_timeout),
            "soft_timeout": td(seconds=self.inprocess_soft_timeout),
            "hard_timeout": td(seconds=self.inprocess_hard_timeout),
            "barrier_timeout": td(seconds=self.inprocess_barrier_timeout),
            "completion_timeout": td(seconds=self.inprocess_barrier_timeout),
            "last_call_wait": td(seconds=self.last_call_wait),
            "termination_grace_time": td(seconds=min(5.0, self.inprocess_hard_timeout / 10)),
        }


@dataclass(frozen=True)
class Ports:
    """Where the trainer's own stores live (see the module docstring)."""

    host: str
    pg_port: int
    inprocess_port: int


def trainer_ports(env: Mapping[str, str] | None = None) -> Ports:
    """Ports of the training PG store and the Wrapper store, from MASTER_ADDR/MASTER_PORT or overrides."""
    env = os.environ if env is None else env
    host = env.get("TRAINER_STORE_HOST") or env.get("MASTER_ADDR") or "127.0.0.1"
    base = int(env.get("MASTER_PORT", "29500"))
    pg_port = int(env.get("TRAINER_PG_PORT", base + PG_PORT_OFFSET))
    inprocess_port = int(env.get("TRAINER_INPROCESS_PORT", base + INPROCESS_PORT_OFFSET))
    if len({base, pg_port, inprocess_port}) != 3:
        raise ValueError(
            f"ports: launcher {base}, process group {pg_port} and in-process {inprocess_port} must differ"
        )
    return Ports(host=host, pg_port=pg_port, inprocess_port=inprocess_port)
