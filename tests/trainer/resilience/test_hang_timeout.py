"""The hang timeout calculated from the measured step time (trainer/resilience/hangtimeout.py) and how
the heartbeat hands it to ft_launcher's rank monitor: the rule, the warm-up, the static timeout during
tier-1 restarts, persistence across workers, and the flags that set it. Cheap: no process is started."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from trainer.resilience.hangtimeout import HangPolicy, StepIntervals, effective_warmup, load_timeout
from trainer.resilience.heartbeat import Heartbeat
from trainer.resilience.nvrx_rank_monitor import TIMEOUTS_STATE_KEY, heartbeat_timeout_from_state
from trainer.resilience.timeouts import TimeoutNestingError, Timeouts


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class MonitorClient:
    """Records what a RankMonitorClient would send to its rank monitor: beats and timeout updates."""

    def __init__(self, initial: float | None = 120.0) -> None:
        self.cfg = type("Cfg", (), {"initial_rank_heartbeat_timeout": initial})()
        self.beats = 0
        self.updates: list[tuple[float | None, float, bool]] = []

    def init_workload_monitoring(self) -> None:
        pass

    def send_heartbeat(self) -> None:
        self.beats += 1

    def shutdown_workload_monitoring(self) -> None:
        pass

    def load_state_dict(self, state: dict[str, Any]) -> None:
        hb = state[TIMEOUTS_STATE_KEY]["heartbeat"]
        self.updates.append((hb["initial"], hb["subsequent"], hb["were_calculated"]))

    @property
    def subsequent(self) -> float:
        return self.updates[-1][1]


def _heartbeat(
    monkeypatch: pytest.MonkeyPatch, policy: HangPolicy, client: MonitorClient
) -> tuple[Heartbeat, Clock]:
    clock = Clock()
    monkeypatch.setattr("trainer.resilience.heartbeat.time.monotonic", clock)
    hb = Heartbeat(enabled=True, client_factory=lambda: client, policy=policy)
    hb.start()
    return hb, clock


def _steps(hb: Heartbeat, clock: Clock, *durations: float) -> None:
    for d in durations:
        clock.now += d
        hb.beat()


def test_the_rule_is_factor_times_longest_step_between_floor_and_ceiling() -> None:
    p = HangPolicy(floor_s=60, factor=3, warmup_steps=5, ceiling_s=600)
    assert p.timeout(0.1) == 60  # a fast step: the floor
    assert p.timeout(30) == 90  # 3 x 30 s
    assert p.timeout(500) == 600  # never above the static timeout
    assert p.clamp(5) == 60 and p.clamp(10_000) == 600
    # A floor above the static timeout: the calculation can only keep the static one.
    assert HangPolicy(floor_s=60, factor=3, warmup_steps=5, ceiling_s=40).timeout(1) == 40
    for bad in ({"floor_s": 0}, {"factor": 1.0}, {"warmup_steps": 0}, {"ceiling_s": float("inf")}):
        kwargs: dict[str, Any] = {"floor_s": 60, "factor": 3, "warmup_steps": 5, "ceiling_s": 600, **bad}
        with pytest.raises(ValueError, match=next(iter(bad))):
            HangPolicy(**kwargs)


def test_warmup_is_stretched_to_measure_a_save_and_a_snapshot() -> None:
    assert effective_warmup(20, ckpt_interval=100) == 101
    assert effective_warmup(20, ckpt_interval=3) == 20
    assert effective_warmup(2, ckpt_interval=3, snapshot_interval=5) == 6
    assert effective_warmup(0, ckpt_interval=3) == 0  # off


def test_intervals_skip_the_gap_across_a_restart() -> None:
    iv = StepIntervals()
    for t in (0.0, 1.0, 2.5):
        iv.observe(t)
    iv.restart()
    iv.observe(100.0)  # first beat after a tier-1 restart: 97.5 s is not a step
    iv.observe(101.0)
    assert iv.count == 3 and iv.longest == 1.5


def test_static_timeout_until_warmup_then_calculated_and_only_raised(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    client = MonitorClient(initial=120.0)
    policy = HangPolicy(floor_s=2, factor=3, warmup_steps=4, ceiling_s=60)
    hb, clock = _heartbeat(monkeypatch, policy, client)
    # At connect the static timeout is made explicit (the monitor may hold an earlier worker's value).
    assert client.updates == [(120.0, 60, False)]
    _steps(hb, clock, 5.0, 0.1, 0.1, 0.1)  # the first beat (after start-up) measures nothing
    assert hb.hang_timeout is None and len(client.updates) == 1
    _steps(hb, clock, 0.4)  # 4th interval: the longest is the 0.4 s step (a save, say)
    assert hb.hang_timeout == pytest.approx(2.0)  # max(2, 3 x 0.4) = floor
    _steps(hb, clock, 1.0)
    assert hb.hang_timeout == pytest.approx(3.0) and client.subsequent == pytest.approx(3.0)
    _steps(hb, clock, 0.1, 0.1)  # shorter steps never lower it
    assert hb.hang_timeout == pytest.approx(3.0)
    _steps(hb, clock, 50.0)  # a very slow step: capped at the static timeout
    assert hb.hang_timeout == 60
    # The launcher's initial timeout is passed through untouched every time, and nothing more is sent
    # than the changes.
    assert {u[0] for u in client.updates} == {120.0}
    assert [u[1] for u in client.updates] == [60, pytest.approx(2.0), pytest.approx(3.0), 60]
    assert client.beats == 9


def test_a_tier1_restart_runs_under_the_static_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    client = MonitorClient()
    policy = HangPolicy(floor_s=2, factor=3, warmup_steps=2, ceiling_s=60)
    hb, clock = _heartbeat(monkeypatch, policy, client)
    _steps(hb, clock, 5.0, 1.0, 1.0)
    assert client.subsequent == pytest.approx(3.0)
    hb.pause()  # an iteration failed: teardown, barrier and restore may take long
    assert client.updates[-1] == (120.0, 60, False) and hb.hang_timeout is None
    clock.now += 40.0  # longer than the calculated timeout, shorter than the static one
    hb.start()  # the next iteration (already connected: no new connection)
    _steps(hb, clock, 5.0)  # its first beat: the calculated timeout is back, the gap was no step
    assert client.subsequent == pytest.approx(3.0) and hb.hang_timeout == pytest.approx(3.0)
    hb.pause()
    hb.pause()  # a second failure while static: nothing more to send
    assert [u[2] for u in client.updates].count(False) == 3  # connect + one per real interruption


def test_a_restarted_worker_reuses_the_persisted_timeout(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    state = tmp_path / "hang-timeouts" / "rank0.json"
    policy = HangPolicy(floor_s=2, factor=3, warmup_steps=3, ceiling_s=60, state_path=state)
    first = MonitorClient()
    hb, clock = _heartbeat(monkeypatch, policy, first)
    _steps(hb, clock, 5.0, 1.5, 1.0, 1.0)
    assert hb.hang_timeout == pytest.approx(4.5)
    # NVRx's own state_dict layout, readable by RankMonitorClient.load_state_dict.
    saved = json.loads(state.read_text())
    assert saved == {
        TIMEOUTS_STATE_KEY: {"heartbeat": {"initial": 120.0, "subsequent": 4.5, "were_calculated": True}}
    }
    assert load_timeout(state) == pytest.approx(4.5)
    # A new worker (new process, new client): in force from its first beat, no warm-up.
    second = MonitorClient()
    hb2, clock2 = _heartbeat(monkeypatch, policy, second)
    assert second.updates == [(120.0, 60, False)]  # start-up is judged by the initial timeout
    _steps(hb2, clock2, 5.0)
    assert hb2.hang_timeout == pytest.approx(4.5)
    # A persisted value outside today's floor/ceiling (the values changed between runs) is clamped.
    tight = HangPolicy(floor_s=10, factor=3, warmup_steps=3, ceiling_s=60, state_path=state)
    hb3, clock3 = _heartbeat(monkeypatch, tight, MonitorClient())
    _steps(hb3, clock3, 5.0)
    assert hb3.hang_timeout == 10
    state.write_text("{torn")
    assert load_timeout(state) is None and load_timeout(tmp_path / "missing.json") is None


def test_no_policy_or_no_launcher_sends_no_timeouts(monkeypatch: pytest.MonkeyPatch) -> None:
    client = MonitorClient()
    hb = Heartbeat(enabled=True, client_factory=lambda: client)
    hb.start()
    for _ in range(50):
        hb.beat()
    hb.pause()
    assert client.updates == [] and client.beats == 50
    made: list[MonitorClient] = []
    off = Heartbeat.from_env({}, policy=HangPolicy(2, 3, 2, 60), client_factory=lambda: made[0])
    off.start()
    off.beat()
    off.pause()
    assert made == []


def test_state_key_and_layout_are_nvrx_s() -> None:
    from nvidia_resiliency_ext.fault_tolerance.data import HeartbeatTimeouts
    from nvidia_resiliency_ext.fault_tolerance.rank_monitor_client import RankMonitorClient

    from trainer.resilience.nvrx_rank_monitor import heartbeat_state

    assert RankMonitorClient.CURRENT_TIMEOUTS_STATE_KEY == TIMEOUTS_STATE_KEY
    state = heartbeat_state(120.0, 4.5, True)
    assert HeartbeatTimeouts(**state[TIMEOUTS_STATE_KEY]["heartbeat"]).are_valid
    assert heartbeat_timeout_from_state(state) == 4.5
    assert heartbeat_timeout_from_state(heartbeat_state(120.0, 60, False)) is None  # static: not kept
    assert heartbeat_timeout_from_state({"other": 1}) is None


def test_the_rank_monitor_client_still_has_no_public_timeout_setter() -> None:
    """Canary of trainer/resilience/nvrx_rank_monitor.py (docs/nvrx-rank-monitor-timeouts.md): NVRx's
    client can only calculate its own heartbeat timeouts, so ours go through its state protocol. Fails
    once NVRx adds a public setter or lets the calculation take a floor: then use that instead."""
    import inspect

    from nvidia_resiliency_ext.fault_tolerance.rank_monitor_client import RankMonitorClient

    public = {n for n in dir(RankMonitorClient) if "timeout" in n.lower() and not n.startswith("_")}
    assert public == {
        "CURRENT_TIMEOUTS_STATE_KEY",
        "calculate_and_set_hb_timeouts",
        "calculate_and_set_section_timeouts",
    }
    assert list(inspect.signature(RankMonitorClient.calculate_and_set_hb_timeouts).parameters) == [
        "self",
        "skip_if_not_ready",
    ]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"hang_timeout_floor": 10.0}, "hang_timeout_floor"),  # not above the 10 s liveness timeout
        ({"hang_timeout_floor": 5.0, "inprocess_liveness_timeout": 5.0}, "hang_timeout_floor"),
        ({"hang_timeout_factor": 1.0}, "hang_timeout_factor"),
        ({"hang_warmup_steps": -1}, "hang_warmup_steps"),
    ],
)
def test_timeouts_reject_hang_values_that_do_not_nest(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(TimeoutNestingError) as err:
        Timeouts(**kwargs).check()
    assert err.value.field == field
    Timeouts(hang_timeout_floor=11.0, hang_timeout_factor=1.5, hang_warmup_steps=0).check()


def test_flags_reach_the_config_and_the_policy(tmp_path: Path) -> None:
    import numpy as np

    from trainer.config.train_config import ConfigError, config_from_args
    from trainer.resilience.hangtimeout import policy_from_config

    data = tmp_path / "tokens.npy"
    np.save(data, np.zeros(4096, dtype=np.uint16))
    base = [f"--out-dir={tmp_path / 'run'}", "--ckpt-interval=7", "--device=cpu"]
    cfg = config_from_args(
        [*base, "--hang-timeout-floor=12.5", "--hang-timeout-factor=4", "--hang-warmup-steps=3"], env={}
    )
    t = cfg.timeouts
    assert (t.hang_timeout_floor, t.hang_timeout_factor, t.hang_warmup_steps) == (12.5, 4.0, 3)
    policy = policy_from_config(cfg, rank=3)
    assert policy is not None
    ceiling = cfg.timeouts.heartbeat_timeout  # the static timeout: the calculated one never exceeds it
    assert (policy.floor_s, policy.factor, policy.warmup_steps, policy.ceiling_s) == (12.5, 4.0, 8, ceiling)
    assert policy.state_path == tmp_path / "run" / "hang-timeouts" / "rank3.json"
    assert policy_from_config(config_from_args([*base, "--hang-warmup-steps=0"], env={}), 0) is None
    defaults = config_from_args(base, env={}).timeouts
    assert (defaults.hang_timeout_floor, defaults.hang_timeout_factor, defaults.hang_warmup_steps) == (
        60,
        3,
        20,
    )
    for flag, field in [
        ("--hang-timeout-floor=nan", "hang_timeout_floor"),
        ("--hang-timeout-floor=3", "hang_timeout_floor"),
        ("--hang-timeout-factor=0.5", "hang_timeout_factor"),
        ("--hang-warmup-steps=1.5", "hang_warmup_steps"),
        ("--hang-warmup-steps=-2", "hang_warmup_steps"),
    ]:
        with pytest.raises(ConfigError) as err:
            config_from_args([*base, flag], env={})
        assert err.value.field == field, flag
