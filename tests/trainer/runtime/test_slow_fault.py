"""The `slow` fault kind (trainer/runtime/faults.py): parsed with one-line errors naming the field, and
bound to the pod that first fired it, so the spare that takes a node's place is not slow."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainer.launcher.supervise import SUPERVISOR_PID_ENV
from trainer.runtime.faults import FaultInjector, FaultSpec, parse_fault


@pytest.mark.parametrize(
    ("text", "spec"),
    [
        ("slow:step=5:rank=1:factor=3", FaultSpec("slow", 5, 1, 0, 3.0)),
        ("slow:step=0:node=2:factor=1.5", FaultSpec("slow", 0, 0, 2, 1.5, by_node=True)),
        ("slow:factor=100:step=7", FaultSpec("slow", 7, 0, 0, 100.0)),
    ],
)
def test_parse_slow(text: str, spec: FaultSpec) -> None:
    assert parse_fault(text) == spec
    assert parse_fault(str(spec)).factor == spec.factor


@pytest.mark.parametrize(
    ("text", "field"),
    [
        ("slow:step=5:rank=1", "factor"),  # slow needs it
        ("sigkill:step=5:rank=1:factor=3", "factor"),  # only slow takes it
        ("slow:step=5:factor=1", "factor"),  # not slower
        ("slow:step=5:factor=0.5", "factor"),
        ("slow:step=5:factor=101", "factor"),
        ("slow:step=5:factor=1e3", "factor"),
        ("slow:step=5:factor=nan", "factor"),
        ("slow:step=5:factor=-3", "factor"),
        ("slow:step=5:rank=1:node=1:factor=3", "node"),  # one or the other
        ("slow:step=5:factor=3:factor=4", "factor=F once each"),
    ],
)
def test_parse_slow_rejects_naming_the_field(text: str, field: str) -> None:
    with pytest.raises(ValueError, match=field) as info:
        parse_fault(text)
    assert "\n" not in str(info.value)


def _injector(tmp_path: Path, spec: str, *, rank: int, node: int) -> tuple[FaultInjector, list[int]]:
    emitted: list[int] = []
    injector = FaultInjector(
        [parse_fault(spec)],
        rank=rank,
        node=node,
        marker_dir=tmp_path,
        emit=lambda kind, step: emitted.append(step),
    )
    return injector, emitted


def test_a_slow_rank_stays_slow_from_its_step_and_its_replacement_pod_is_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(SUPERVISOR_PID_ENV, "1001")  # pod A
    slow, emitted = _injector(tmp_path, "slow:step=3:rank=1:factor=3", rank=1, node=1)
    assert [slow.slow_factor(s) for s in range(6)] == [1, 1, 1, 3, 3, 3]
    other, _ = _injector(tmp_path, "slow:step=3:rank=1:factor=3", rank=0, node=0)
    assert other.slow_factor(5) == 1.0
    # A restarted worker of the same pod: still slow, and the fault is not reported twice.
    again, emitted_again = _injector(tmp_path, "slow:step=3:rank=1:factor=3", rank=1, node=1)
    assert again.slow_factor(7) == 3.0
    assert emitted == [3] and emitted_again == []
    # The spare's pod takes rank 1 after an eviction: not slow.
    monkeypatch.setenv(SUPERVISOR_PID_ENV, "2002")
    spare, _ = _injector(tmp_path, "slow:step=3:rank=1:factor=3", rank=1, node=1)
    assert spare.slow_factor(9) == 1.0


def test_node_slows_every_rank_of_the_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(SUPERVISOR_PID_ENV, "1001")
    spec = "slow:step=2:node=1:factor=2.5"
    factors = {
        (rank, node): _injector(tmp_path, spec, rank=rank, node=node)[0].slow_factor(4)
        for rank, node in ((0, 0), (1, 0), (2, 1), (3, 1))
    }
    assert factors == {(0, 0): 1.0, (1, 0): 1.0, (2, 1): 2.5, (3, 1): 2.5}


def test_slow_does_not_fire_as_a_step_fault(tmp_path: Path) -> None:
    injector, emitted = _injector(tmp_path, "slow:step=3:rank=0:factor=3", rank=0, node=0)
    injector.at_step(3)  # no exception, no kill, no marker of its own
    assert emitted == [] and not list(tmp_path.iterdir())
