"""Tier 2 hang detection: heartbeats from each rank to its ft_launcher rank monitor.

ft_launcher starts one rank monitor process per local rank and tells the rank where it listens through
FT_RANK_MONITOR_IPC_SOCKET. The rank connects with NVRx's RankMonitorClient and sends a heartbeat after
every training step. When no heartbeat arrives for `--ft-rank-heartbeat-timeout` seconds (before the first
one: `--ft-initial-rank-heartbeat-timeout`, counted from `start()`), the monitor sends SIGCONT and then the
termination signal (SIGKILL by default) to the rank, and the launcher restarts every worker. A rank stuck
in Python, blocked in C or frozen with SIGSTOP is caught the same way; detection takes the timeout plus up
to one `--ft-workload-check-interval`.

Outside ft_launcher (plain `python -m trainer`, torchrun, tests) `Heartbeat.from_env()` returns a no-op,
so the training loop calls `beat()` unconditionally.

The connection belongs to the process, not to a tier-1 iteration: `start()` is idempotent, so the
in-process Wrapper can re-run the training function without reconnecting (a second InitMsg would reset
the monitor's initial-timeout clock). While a tier-1 restart is in progress no heartbeats flow, which is
why trainer/resilience/timeouts.py requires heartbeat_timeout to exceed every tier-1 timeout.

With a HangPolicy (trainer/resilience/hangtimeout.py) the heartbeat timeout in force becomes the one
calculated from this rank's measured step time once the warm-up is measured (or from its first step
when an earlier worker persisted one); `pause()` puts the static timeout back for the length of a
tier-1 restart or the run's final commit, and the calculated one returns with the next beat.

Only RankMonitorClient(), init_workload_monitoring(), send_heartbeat() and shutdown_workload_monitoring()
are used (same signatures in NVRx 0.4.1 and 0.7.x), plus, with a HangPolicy, the client's state protocol
through trainer/resilience/nvrx_rank_monitor.py.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from trainer.resilience.hangtimeout import HangPolicy, StepIntervals, load_timeout, save_state

log = logging.getLogger(__name__)

#: Set by ft_launcher in every worker: the rank monitor's Unix socket (same name in NVRx 0.4.1 and 0.7.x).
RANK_MONITOR_SOCKET_ENV = "FT_RANK_MONITOR_IPC_SOCKET"


class _Client(Protocol):
    def init_workload_monitoring(self) -> None: ...
    def send_heartbeat(self) -> None: ...
    def shutdown_workload_monitoring(self) -> None: ...


def _nvrx_client() -> _Client:
    # Imported lazily: importing NVRx's fault_tolerance package costs ~1 s, wasted when not under a launcher.
    from nvidia_resiliency_ext.fault_tolerance import RankMonitorClient

    client: Any = RankMonitorClient()
    return client


class Heartbeat:
    """Heartbeats to the local ft_launcher rank monitor; a no-op when `enabled` is False.

    `min_interval_s` drops beats closer than that to the previous one, bounding the IPC cost of very
    short steps (each beat is one round trip over a Unix socket, ~0.1 ms).
    A beat that fails (the monitor is gone: the launcher is shutting down) is logged once and disables
    further beats rather than failing a training step; losing the monitor is the launcher's to handle.
    """

    def __init__(
        self,
        *,
        enabled: bool,
        client_factory: Callable[[], _Client] = _nvrx_client,
        min_interval_s: float = 0.0,
        policy: HangPolicy | None = None,
    ) -> None:
        if min_interval_s < 0:
            raise ValueError(f"min_interval_s: must be >= 0, got {min_interval_s}")
        self._enabled = enabled
        self._factory = client_factory
        self._min_interval_s = min_interval_s
        self._client: _Client | None = None
        self._last_beat = float("-inf")
        self.beats_sent = 0
        """Heartbeats delivered to the monitor since start() (for tests and logs)."""
        self._policy = policy
        self._intervals = StepIntervals()
        self._calculated: float | None = None  # the best hang timeout known (measured or persisted)
        self._in_force: float | None = None  # the calculated timeout the monitor has now (None: static)
        self._initial: float | None = None  # the monitor's initial timeout, kept as the launcher set it

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **kwargs: Any) -> Heartbeat:
        """Enabled only when running under ft_launcher, i.e. when the rank monitor socket is set."""
        env = os.environ if env is None else env
        return cls(enabled=bool(env.get(RANK_MONITOR_SOCKET_ENV)), **kwargs)

    @property
    def enabled(self) -> bool:
        """Whether heartbeats go anywhere (under ft_launcher and not disabled by a failed beat)."""
        return self._enabled

    @property
    def started(self) -> bool:
        """Whether the connection to the rank monitor is open."""
        return self._client is not None

    def start(self) -> None:
        """Connect to the rank monitor (idempotent; a no-op when disabled).

        Call it as early as possible in the process: the monitor's initial timeout runs from here, so
        a rank that hangs in process-group set-up or checkpoint loading is caught too.
        """
        if not self._enabled:
            return
        if self._client is not None:  # a new tier-1 iteration: its first step is not measured
            self._intervals.restart()
            return
        client = self._factory()
        try:
            client.init_workload_monitoring()
        except OSError as exc:
            # ft_launcher (0.4.1 and 0.7.0) never restarts a rank monitor that died: failing here would
            # fail every restart of this rank until the launcher's restarts run out, then the whole job.
            # Run without launcher heartbeats instead; the Wrapper, the collective timeout and the
            # launcher's worker-exit monitor still watch this rank.
            log.warning("heartbeat: rank monitor unreachable (%s): running without launcher heartbeats", exc)
            self._enabled = False
            return
        self._client = client
        log.info("heartbeat: connected to the ft_launcher rank monitor")
        if self._policy is not None:
            self._adopt_persisted(client)

    def beat(self) -> None:
        """Tell the monitor this rank made progress (call after every step)."""
        if self._client is None:
            return
        now = time.monotonic()
        if now - self._last_beat < self._min_interval_s:
            return
        try:
            self._client.send_heartbeat()
        except Exception as exc:  # the monitor process is gone or the socket broke
            log.warning("heartbeat: disabled after a failed beat: %s", exc)
            self._drop()
            return
        self._last_beat = now
        self.beats_sent += 1
        if self._policy is not None:
            self._intervals.observe(now)
            self._maybe_calculate()

    @property
    def hang_timeout(self) -> float | None:
        """The calculated hang timeout the rank monitor has now (None: the static one is in force)."""
        return self._in_force

    def pause(self) -> None:
        """No step beats for a while: until the next beat the static timeout holds, not the calculated one.

        Called where an iteration fails (a tier-1 restart: teardown, barrier, restore) and after the last
        step (the final commit and the run's end); the next beat restores the calculated timeout and the
        gap is not measured as a step."""
        self._intervals.restart()
        if self._client is None or self._policy is None or self._in_force is None:
            return
        self._push(self._policy.ceiling_s, calculated=False)
        self._in_force = None

    def stop(self) -> None:
        """Close the connection (end of training); the monitor then stops watching this rank."""
        if self._client is None:
            return
        try:
            self._client.shutdown_workload_monitoring()
        except Exception as exc:  # closing a dead socket: nothing to recover
            log.debug("heartbeat: shutdown: %s", exc)
        self._client = None

    def _drop(self) -> None:
        self._enabled = False
        self.stop()

    # ------------------------------------------------------------------ calculated hang timeout
    def _adopt_persisted(self, client: Any) -> None:
        """At connect: take the initial timeout as the launcher set it, an earlier worker's calculated
        timeout if there is one, and make the monitor's subsequent timeout explicit (the rank monitor
        outlives worker restarts and keeps whatever the previous worker set)."""
        from trainer.resilience.nvrx_rank_monitor import initial_heartbeat_timeout

        assert self._policy is not None
        self._initial = initial_heartbeat_timeout(client)
        persisted = load_timeout(self._policy.state_path)
        if persisted is not None:
            self._calculated = self._policy.clamp(persisted)
            log.info("heartbeat: hang timeout %.2f s from %s", self._calculated, self._policy.state_path)
        self._push(self._policy.ceiling_s, calculated=False)

    def _maybe_calculate(self) -> None:
        policy = self._policy
        assert policy is not None
        measured = self._intervals.count >= policy.warmup_steps
        if measured:
            value = policy.timeout(self._intervals.longest)
            if self._calculated is None or value > self._calculated:
                self._calculated = value
                log.info(
                    "heartbeat: hang timeout %.2f s (%g x longest step %.3f s over %d steps; floor %g s, "
                    "static %g s)",
                    value, policy.factor, self._intervals.longest, self._intervals.count,
                    policy.floor_s, policy.ceiling_s,
                )  # fmt: skip
                if policy.state_path is not None:
                    from trainer.resilience.nvrx_rank_monitor import heartbeat_state

                    try:
                        save_state(policy.state_path, heartbeat_state(self._initial, value, True))
                    except OSError as exc:  # persisting is an optimisation, never a reason to stop
                        log.warning("heartbeat: could not persist the hang timeout: %s", exc)
        wanted = self._calculated
        if wanted is not None and wanted != self._in_force and self._push(wanted, calculated=True):
            self._in_force = wanted

    def _push(self, subsequent_s: float, *, calculated: bool) -> bool:
        from trainer.resilience.nvrx_rank_monitor import set_heartbeat_timeouts

        if self._client is None:
            return False
        try:
            set_heartbeat_timeouts(self._client, self._initial, subsequent_s, calculated)
        except Exception as exc:  # the monitor is gone: as for a failed beat
            log.warning("heartbeat: disabled after failing to set the timeout: %s", exc)
            self._drop()
            return False
        return True
