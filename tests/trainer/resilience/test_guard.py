"""The numerical guard's rules (trainer/resilience/guard.py), the suspect-node hook, the nan and spike
fault kinds, and the step check's hook and all_reduce on one gloo rank: fast, no training run."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import torch

from trainer.config.settings import ConfigError
from trainer.config.train_config import config_from_args
from trainer.resilience import suspect
from trainer.resilience.guard import (
    RECORD,
    Guard,
    GuardConfig,
    SkipRecord,
    Windows,
    local_finding,
    pack,
    spike,
    unpack,
)
from trainer.runtime.faults import SPIKE_FACTOR, FaultInjector, FaultSpec, parse_fault

CFG = GuardConfig(spike_factor=10.0, window=4, suspect_trips=2)


def _windows(loss: list[float], grad: list[float]) -> Windows:
    w = Windows(CFG.window)
    for a, b in zip(loss, grad, strict=True):
        w.keep(a, b)
    return w


def test_a_finite_step_in_a_steady_run_passes() -> None:
    w = _windows([2.0, 2.1, 1.9, 2.0], [1.0, 1.2, 0.9, 1.1])
    assert local_finding(2.05, 1.0, w, CFG) is None
    assert local_finding(19.0, 10.0, w, CFG) is None  # just under 10 x both medians


@pytest.mark.parametrize(
    ("loss", "grad", "why"),
    [
        (math.nan, 1.0, "loss is nan"),
        (math.inf, 1.0, "loss is inf"),
        (2.0, math.nan, "grad_norm is nan"),
        (2.0, -math.inf, "grad_norm is -inf"),
        (25.0, 1.0, "loss 25 > 10 x median 2"),
        (2.0, 11.0, "grad_norm 11 > 10 x median 1.05"),
    ],
)
def test_a_non_finite_value_or_a_spike_trips(loss: float, grad: float, why: str) -> None:
    w = _windows([2.0, 2.0, 2.0, 2.0], [1.0, 1.1, 1.0, 1.1])
    assert local_finding(loss, grad, w, CFG) == why


def test_spikes_are_judged_only_once_the_window_is_full() -> None:
    w = _windows([2.0, 2.0, 2.0], [1.0, 1.0, 1.0])
    assert local_finding(100.0, 100.0, w, CFG) is None  # a run's first, falling steps
    assert local_finding(math.nan, None, w, CFG) == "loss is nan"  # non-finite: always
    w.keep(2.0, 1.0)
    assert local_finding(100.0, None, w, CFG) is not None


def test_a_value_the_step_did_not_give_is_not_judged() -> None:
    assert local_finding(None, None, _windows([1.0] * 4, [1.0] * 4), CFG) is None
    assert spike(5.0, [0.0] * 4, 2.0, 4) is False  # a zero median (all-zero grads): nothing to compare


def test_the_window_keeps_the_newest_values_and_round_trips() -> None:
    w = _windows([1.0, 2.0, 3.0, 4.0], [1.0, 1.0, 1.0, 1.0])
    w.keep(5.0, None)
    assert list(w.loss) == [2.0, 3.0, 4.0, 5.0] and list(w.grad) == [1.0] * 4
    again = Windows(3)  # a smaller window than the checkpoint's keeps the newest
    again.load_state_dict(w.state_dict())
    assert list(again.loss) == [3.0, 4.0, 5.0]
    fresh = Windows(3)
    fresh.load_state_dict(None)  # a checkpoint written with the guard off
    assert not fresh.loss and not fresh.grad


def test_the_verdict_names_the_one_tripped_rank_from_the_sums() -> None:
    ranks = [pack(2.0, None, 0, 1.0), pack(math.nan, "loss is nan", 1, None), pack(2.0, None, 2, 3.0)]
    summed = [math.fsum(col) for col in zip(*ranks, strict=True)]
    verdict = unpack(summed)
    assert not verdict.ok and verdict.tripped == 1 and verdict.ranks() == [1]
    assert verdict.loss_sum == 4.0  # a non-finite loss does not poison the sum
    assert verdict.grad_sq == 10.0  # the global norm^2 of disjoint shards
    two = unpack([0.0, 2.0, 3.0, 0.0])  # ranks 1 and 2, or 0 and 3: the gathered flags say which
    assert two.ranks([0, 1, 1, 0]) == [1, 2]
    assert unpack([6.0, 0.0, 0.0, 1.0]).ok


def test_the_record_round_trips_and_a_trip_is_recorded_before_anyone_restores(tmp_path: Path) -> None:
    guard = Guard(CFG, tmp_path, rank=0)
    assert guard.skips_at(5) == 0
    first = guard.tripped(5, [1])
    assert first.suspects == [] and guard.skips_at(5) == 1
    second = guard.tripped(5, [1, 2])  # the next batch at step 5 tripped too
    assert second.suspects == [1]  # the second trip of rank 1 (suspect_trips=2), reported once
    assert guard.tripped(9, [1]).suspects == []
    again = Guard(CFG, tmp_path, rank=3)  # a restarted process reads what rank 0 wrote
    assert again.record == SkipRecord({5: 2, 9: 1}, {1: 3, 2: 1})
    assert again.skips_at(5) == 2
    Guard(CFG, tmp_path / "other", rank=1).tripped(1, [0])  # only rank 0 writes
    assert not (tmp_path / "other" / RECORD).exists()


@pytest.mark.parametrize(
    "text",
    [
        "not json",
        "[]",
        '{"skips": {"x": 1}}',
        '{"skips": {"3": 0}}',
        '{"skips": {"3": true}}',
        '{"other": {}}',
    ],
)
def test_a_malformed_record_is_refused_naming_the_field(tmp_path: Path, text: str) -> None:
    (tmp_path / RECORD).parent.mkdir(parents=True)
    (tmp_path / RECORD).write_text(text)
    with pytest.raises(ConfigError, match=r"^config error: guard_record: "):
        Guard(CFG, tmp_path, rank=0)
    Guard(GuardConfig(enabled=False), tmp_path, rank=0)  # off: not read


@pytest.mark.parametrize(
    ("flag", "field"),
    [
        ("--guard-spike-factor=1", "guard_spike_factor"),
        ("--guard-spike-factor=nan", "guard_spike_factor"),
        ("--guard-window=2", "guard_window"),
        ("--guard-suspect-trips=0", "guard_suspect_trips"),
    ],
)
def test_bad_guard_settings_are_refused_in_one_line(flag: str, field: str) -> None:
    with pytest.raises(ConfigError, match=rf"^config error: {field}: must"):
        config_from_args(["--out-dir=/tmp/unused", flag], env={})


def test_the_numeric_fault_kinds_parse_with_a_factor_for_spike_alone() -> None:
    assert parse_fault("nan:step=4:rank=1") == FaultSpec("nan", 4, 1, 0)
    assert parse_fault("spike:step=2:factor=50") == FaultSpec("spike", 2, 0, 0, 50.0)
    assert str(parse_fault("spike:step=2:factor=50")) == "spike:step=2:rank=0:node=0:factor=50.0"
    for text, field in [
        ("nan:step=1:factor=5", "factor applies to slow and spike only"),
        ("spike:step=1:factor=1", "factor must be a finite number > 1"),
        ("spike:step=1:factor=nan", "factor must be a finite number > 1"),
        ("spike:step=1:factor=ten", "factor must be a number"),
        ("spike:step=1:factor=5:factor=6", "bad part"),
    ]:
        with pytest.raises(ValueError, match=field):
            parse_fault(text)


def test_a_numeric_fault_is_armed_for_its_step_once_per_run(tmp_path: Path) -> None:
    fired: list[tuple[str, int]] = []
    specs = [parse_fault("nan:step=2:rank=1"), parse_fault("spike:step=4:rank=1")]
    inj = FaultInjector(specs, rank=1, node=0, marker_dir=tmp_path, emit=lambda k, s: fired.append((k, s)))
    inj.at_step(1)
    assert inj.numeric(1) is None
    inj.at_step(2)
    factor = inj.numeric(2)
    assert factor is not None and math.isnan(factor) and fired == [("nan", 2)]
    inj.at_step(3)
    assert inj.numeric(3) is None and inj.numeric(2) is None  # disarmed at the next step
    inj.at_step(4)
    assert inj.numeric(4) == SPIKE_FACTOR
    again = FaultInjector(specs, rank=1, node=0, marker_dir=tmp_path, emit=lambda k, s: None)
    again.at_step(2)  # a replay of step 2 after the rollback, or a restarted process
    assert again.numeric(2) is None
    other = FaultInjector(specs, rank=0, node=0, marker_dir=tmp_path / "o", emit=lambda k, s: None)
    other.at_step(2)
    assert other.numeric(2) is None


def test_a_suspect_node_reaches_the_event_and_every_handler() -> None:
    seen: list[suspect.SuspectNode] = []
    emitted: list[dict[str, Any]] = []

    class Events:
        def emit(self, ev: str, **fields: Any) -> None:
            emitted.append({"ev": ev, **fields})

    def broken(_: suspect.SuspectNode) -> None:
        raise RuntimeError("a handler's own bug")

    remove = suspect.on_suspect(seen.append)
    remove_broken = suspect.on_suspect(broken)
    try:
        node = suspect.SuspectNode(suspect.node_of(5, 4), (5,), "guard", "2 trips", 9)
        suspect.report(node, Events(), rank=0)
        suspect.report(node, Events(), rank=3)  # every rank runs the handlers; only rank 0 writes
    finally:
        remove()
        remove_broken()
    assert node.node == 1 and seen == [node, node]
    assert emitted == [
        {"ev": "node_suspect", "node": 1, "ranks": [5], "source": "guard", "reason": "2 trips", "step": 9}
    ]


def test_the_step_check_folds_the_verdict_and_corrupts_the_update(one_rank: Any, tmp_path: Path) -> None:
    """One gloo rank: the hook sees the gradients only inside the step, an armed nan fault reaches the
    optimizer's update, the verdict trips, and with the guard off one float is reduced as before."""
    from trainer.runtime.step_check import StepCheck

    model = torch.nn.Linear(3, 1)
    optim = torch.optim.SGD(model.parameters(), lr=0.1)
    inj = FaultInjector(
        [parse_fault("nan:step=1")], rank=0, node=0, marker_dir=tmp_path, emit=lambda k, s: None
    )
    windows = Windows(3)
    check = StepCheck(
        Guard(CFG, tmp_path, rank=0), optim, windows, inj, rank=0, world_size=1, device=torch.device("cpu")
    )

    def step(n: int) -> Any:
        inj.at_step(n)
        check.begin(n)
        loss = model(torch.ones(2, 3)).pow(2).mean()
        loss.backward()
        optim.step()
        optim.zero_grad()
        logged = check.faulted_loss(loss.detach())  # job.log, inside the step
        check.end()
        return check.reduce(logged)

    ok = step(0)
    assert ok.verdict is not None and ok.verdict.ok and ok.grad_norm is not None and ok.grad_norm > 0
    assert len(windows.loss) == 1 and ok.loss_mean == ok.loss
    bad = step(1)
    assert bad.verdict is not None and not bad.verdict.ok and bad.finding == "loss is nan"
    assert check.tripped_ranks(bad) == [0]
    assert torch.isnan(model.weight).all()  # the update itself was corrupt: only a restore undoes it
    assert len(windows.loss) == 1  # a tripped step's values never join the medians
    optim.step()  # outside a step (a restore's template build): the hook does nothing
    check.close()
    off = StepCheck(
        Guard(GuardConfig(enabled=False), tmp_path, rank=0), optim, Windows(3), inj,
        rank=0, world_size=1, device=torch.device("cpu"),
    )  # fmt: skip
    assert off.buf.numel() == 1
    plain = off.reduce(torch.tensor(3.0))
    assert plain.verdict is None and plain.loss_mean == 3.0
    off.close()
