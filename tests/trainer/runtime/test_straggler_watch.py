"""The step loop's straggler watch (trainer/runtime/straggler_watch.py) without a process group: the
buffer's layout (each rank writes only its slots, so a SUM hands every rank every figure), a slow rank's
delay, and what a finding writes (the straggler event from the node's first rank, the shared suspect-node
record from rank 0)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from trainer.resilience.straggler import FAST_STEPS, WARMUP, WINDOW
from trainer.runtime.straggler_watch import SpareProbe, StragglerWatch, last_eviction, slots


class _Events:
    def __init__(self) -> None:
        self.emitted: list[tuple[str, dict[str, Any]]] = []

    def emit(self, ev: str, **fields: Any) -> None:
        self.emitted.append((ev, fields))


class _Faults:
    def __init__(self, factor: float = 1.0) -> None:
        self.factor = factor

    def slow_factor(self, step: int) -> float:
        return self.factor


def _watch(tmp_path: Path, rank: int, policy: str = "report", factor: float = 1.0) -> StragglerWatch:
    cfg = SimpleNamespace(run=SimpleNamespace(straggler_policy=policy, out_dir=tmp_path))
    proc = SimpleNamespace(rank=rank, world_size=2)
    buffer = torch.zeros(slots(2))
    return StragglerWatch(cfg, proc, _Events(), _Faults(factor), buffer)  # type: ignore[arg-type]


def test_each_rank_fills_only_its_slots_so_a_sum_holds_every_figure(tmp_path: Path) -> None:
    a, b = _watch(tmp_path, 0), _watch(tmp_path, 1)
    now = time.time()
    a.arrive(0, now - 0.1)
    b.arrive(0, now - 0.3)
    total = a.buffer + b.buffer  # what the all_reduce's SUM gives both
    compute, wait = total[0:2].tolist(), total[2:4].tolist()
    assert compute[0] == pytest.approx(0.1, abs=0.05) and compute[1] == pytest.approx(0.3, abs=0.05)
    assert wait == [0.0, 0.0]  # no previous step
    a.reduced(0, 0.2)
    a.arrive(1, time.time())
    assert a.buffer[1].item() == 0.0 and a.buffer[2].item() == pytest.approx(0.2)  # last step's wait


def test_a_slow_rank_sleeps_its_factor_and_reports_it_as_compute(tmp_path: Path) -> None:
    watch = _watch(tmp_path, 1, factor=3.0)
    started = time.time()
    watch.arrive(4, started - 0.1)
    assert time.time() - started == pytest.approx(0.2, abs=0.1)  # (3 - 1) x 0.1 s
    assert watch.buffer[1].item() == pytest.approx(0.3, abs=0.1)


def test_a_finding_is_reported_once_as_a_straggler_and_once_as_a_suspect_node(tmp_path: Path) -> None:
    watches = [_watch(tmp_path, 0), _watch(tmp_path, 1)]
    for step in range(WARMUP + WINDOW):
        for w in watches:
            w.buffer.zero_()
            w.buffer[0:2] = torch.tensor([0.1, 0.3])
            w.reduced(step, 0.0)
    # rank 0 writes the shared suspect-node record; the straggling node's first rank the straggler event
    ((ev, suspect),) = watches[0].events.emitted  # type: ignore[attr-defined]
    assert ev == "node_suspect" and suspect["source"] == "straggler"
    assert (suspect["node"], suspect["ranks"], suspect["step"]) == (1, [1], WARMUP + FAST_STEPS - 1)
    ((ev, fields),) = watches[1].events.emitted  # type: ignore[attr-defined]
    assert ev == "straggler" and fields["node"] == 1 and fields["action"] == "report"
    assert fields["reason"] == "policy is report" and fields["score"] == pytest.approx(3.0)


def test_evict_without_a_launcher_store_reports_no_spare(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TRAINER_LIVENESS_STORE", raising=False)
    watch = _watch(tmp_path, 1, policy="evict")
    for step in range(WARMUP + WINDOW):
        watch.buffer.zero_()
        watch.buffer[0:2] = torch.tensor([0.1, 0.3])
        watch.reduced(step, 0.0)
        watch.after_step(lambda: None)
    ((_, fields),) = watch.events.emitted  # type: ignore[attr-defined]
    assert (fields["action"], fields["reason"]) == ("report", "no hot spare stands by")
    assert last_eviction(tmp_path / "straggler" / "evictions.jsonl") is None


def test_each_step_carries_its_wait_for_the_straggler(tmp_path: Path) -> None:
    watch = _watch(tmp_path, 0)
    waits = []
    for step in range(WARMUP + 1):
        watch.buffer.zero_()
        watch.buffer[0:2] = torch.tensor([0.1, 0.3])
        watch.reduced(step, 0.0)
        waits.append(watch.straggler_s)
    assert waits == [0.0] * WARMUP + [pytest.approx(0.2)]  # what the step event's straggler_s says


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_spare_probe_answers_from_the_background_while_it_is_fresh() -> None:
    asked: list[float] = []
    clock = _Clock()

    def ask() -> bool:
        asked.append(clock.now)
        return True

    probe = SpareProbe(ask, clock)
    probe.start()
    assert probe.answer(5.0) is True and asked == [0.0]  # waited for the question out, asked no more
    clock.now = 4.0
    assert probe.answer(5.0) is True and asked == [0.0]
    clock.now = 9.0  # stale: asked again, in the caller's thread
    assert probe.answer(5.0) is True and asked == [0.0, 9.0]


def test_the_spare_probe_asks_one_question_at_a_time() -> None:
    import threading

    release = threading.Event()
    calls: list[int] = []

    def ask() -> bool:
        calls.append(1)
        release.wait(5.0)
        return False

    probe = SpareProbe(ask)
    probe.start()
    probe.start()  # one is out: no second
    release.set()
    assert probe.answer(60.0) is False and len(calls) == 1


def test_only_the_evicting_nodes_first_rank_probes_and_only_with_the_evict_policy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TRAINER_LIVENESS_STORE", raising=False)
    started: list[int] = []
    for rank, policy in ((0, "evict"), (1, "report"), (1, "evict")):
        watch = _watch(tmp_path, rank, policy=policy)
        monkeypatch.setattr(watch.probe, "start", lambda r=rank: started.append(r))
        for step in range(WARMUP + 1):
            watch.buffer.zero_()
            watch.buffer[0:2] = torch.tensor([0.1, 0.3])
            watch.reduced(step, 0.0)
    assert started == [1]  # rank 1 is node 1, past the threshold, under the evict policy


def test_under_evict_the_straggling_nodes_ranks_act_after_the_steps_replica_is_sent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Node 1 = ranks 2, 3: both flush their snapshot's replica once the step is kept; rank 2 alone then
    decides and writes the straggler event. Node 0's ranks neither flush nor act."""
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    monkeypatch.delenv("TRAINER_LIVENESS_STORE", raising=False)
    cfg = SimpleNamespace(run=SimpleNamespace(straggler_policy="evict", out_dir=tmp_path))
    log: list[tuple[int, str]] = []
    watches = []
    for rank in range(4):
        proc = SimpleNamespace(rank=rank, world_size=4)
        watches.append(StragglerWatch(cfg, proc, _Events(), _Faults(), torch.zeros(slots(4))))  # type: ignore[arg-type]
    for step in range(WARMUP + FAST_STEPS):
        for w in watches:
            w.buffer.zero_()
            w.buffer[0:4] = torch.tensor([0.1, 0.1, 0.3, 0.3])
            w.reduced(step, 0.0)
            stragglers = [ev for ev, _ in w.events.emitted if ev == "straggler"]  # type: ignore[attr-defined]
            assert stragglers == []  # nothing acted on before the step is kept
            w.after_step(lambda r=w.proc.rank: log.append((r, "flush")))
            if any(ev == "straggler" for ev, _ in w.events.emitted):  # type: ignore[attr-defined]
                log.append((w.proc.rank, "act"))
    assert log == [(2, "flush"), (2, "act"), (3, "flush")]


def test_the_last_eviction_is_read_from_the_run_record(tmp_path: Path) -> None:
    path = tmp_path / "evictions.jsonl"
    path.write_text(
        json.dumps({"step": 9, "node": 1}) + "\n" + json.dumps({"step": 30, "node": 0}) + "\n{torn"
    )
    assert last_eviction(path) == 30


@pytest.mark.parametrize("guard_on", [True, False])
def test_the_watch_rides_in_the_step_checks_one_all_reduce(
    one_rank: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, guard_on: bool
) -> None:
    """The watch's slots follow the loss (and the guard's numbers): one all_reduce carries both, the loss
    and the verdict read as without the watch, the timings as the watch wrote them."""
    import torch.distributed as dist

    from trainer.resilience.guard import Guard, GuardConfig, Windows
    from trainer.runtime.step_check import StepCheck

    model = torch.nn.Linear(3, 1)
    optim = torch.optim.SGD(model.parameters(), lr=0.1)
    guard = Guard(GuardConfig(enabled=guard_on), tmp_path, rank=0)
    faults = _Faults()
    faults.specs = []  # type: ignore[attr-defined]
    check = StepCheck(
        guard, optim, Windows(3), faults,  # type: ignore[arg-type]
        rank=0, world_size=1, device=torch.device("cpu"), extra=slots(1),
    )  # fmt: skip
    cfg = SimpleNamespace(run=SimpleNamespace(straggler_policy="report", out_dir=tmp_path))
    watch = StragglerWatch(cfg, SimpleNamespace(rank=0, world_size=1), _Events(), faults, check.extra)  # type: ignore[arg-type]
    reduces: list[int] = []
    real = dist.all_reduce

    def counted(t: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        reduces.append(t.numel())
        return real(t, *args, **kwargs)

    monkeypatch.setattr(dist, "all_reduce", counted)
    check.begin(0)
    check.end()
    watch.arrive(0, time.time() - 0.2)
    checked = check.reduce(torch.tensor(2.5))
    assert reduces == [check.buf.numel()] and check.buf.numel() == (4 if guard_on else 1) + 2
    assert checked.loss_mean == pytest.approx(2.5)
    assert (checked.verdict is not None and checked.verdict.ok) == guard_on
    assert watch.buffer[0].item() == pytest.approx(0.2, abs=0.1) and watch.buffer[1].item() == 0.0
    check.close()
