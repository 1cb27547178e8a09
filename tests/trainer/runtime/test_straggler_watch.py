"""The step loop's straggler watch (trainer/runtime/straggler_watch.py) without a process group: the
buffer's layout (each rank writes only its slots, so a SUM hands every rank every figure), a slow rank's
delay, and what a finding writes."""

from __future__ import annotations

import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from trainer.resilience.straggler import WARMUP, WINDOW
from trainer.runtime.straggler_watch import StragglerWatch, last_eviction


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
    return StragglerWatch(cfg, proc, _Events(), _Faults(factor), torch.device("cpu"))  # type: ignore[arg-type]


def test_each_rank_fills_only_its_slots_so_a_sum_holds_every_figure(tmp_path: Path) -> None:
    a, b = _watch(tmp_path, 0), _watch(tmp_path, 1)
    now = time.time()
    a.arrive(0, now - 0.1, torch.tensor(2.0))
    b.arrive(0, now - 0.3, torch.tensor(4.0))
    total = a.buffer + b.buffer  # what the all_reduce's SUM gives both
    loss, compute, wait = total[0].item(), total[1:3].tolist(), total[3:5].tolist()
    assert loss == pytest.approx(6.0)
    assert compute[0] == pytest.approx(0.1, abs=0.05) and compute[1] == pytest.approx(0.3, abs=0.05)
    assert wait == [0.0, 0.0]  # no previous step
    a.reduced(0, 0.2)
    a.arrive(1, time.time(), None)
    assert a.buffer[0].item() == 0.0 and a.buffer[3].item() == pytest.approx(0.2)  # last step's wait


def test_a_slow_rank_sleeps_its_factor_and_reports_it_as_compute(tmp_path: Path) -> None:
    watch = _watch(tmp_path, 1, factor=3.0)
    started = time.time()
    watch.arrive(4, started - 0.1, None)
    assert time.time() - started == pytest.approx(0.2, abs=0.1)  # (3 - 1) x 0.1 s
    assert watch.buffer[2].item() == pytest.approx(0.3, abs=0.1)


def test_the_straggling_nodes_first_rank_reports_it_once(tmp_path: Path) -> None:
    watches = [_watch(tmp_path, 0), _watch(tmp_path, 1)]
    for step in range(WARMUP + WINDOW):
        for w in watches:
            w.buffer.zero_()
            w.buffer[1:3] = torch.tensor([0.1, 0.3])
            w.reduced(step, 0.0)
    assert watches[0].events.emitted == []  # type: ignore[attr-defined]
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
        watch.buffer[1:3] = torch.tensor([0.1, 0.3])
        watch.reduced(step, 0.0)
    ((_, fields),) = watch.events.emitted  # type: ignore[attr-defined]
    assert (fields["action"], fields["reason"]) == ("report", "no hot spare stands by")
    assert last_eviction(tmp_path / "straggler" / "evictions.jsonl") is None


def test_the_last_eviction_is_read_from_the_run_record(tmp_path: Path) -> None:
    path = tmp_path / "evictions.jsonl"
    path.write_text(
        json.dumps({"step": 9, "node": 1}) + "\n" + json.dumps({"step": 30, "node": 0}) + "\n{torn"
    )
    assert last_eviction(path) == 30
