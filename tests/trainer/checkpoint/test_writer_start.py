"""When the writers' helper process starts (trainer/checkpoint/backends.py NvrxBackend start_worker,
CheckpointLoop.after_step): the training loop's manager starts NVRx's worker after an attempt's first
step, not while the ranks build and restore, and a save due before it is up is written in the process."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from trainer.checkpoint.backends import NvrxBackend
from trainer.checkpoint.config import CheckpointConfig
from trainer.checkpoint.loop import CheckpointLoop


def test_a_deferred_backend_starts_no_worker_until_asked_and_then_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    started: list[int] = []
    monkeypatch.setattr(NvrxBackend, "_shared_queue", classmethod(lambda cls: started.append(1) or "queue"))
    monkeypatch.setattr(NvrxBackend, "_queue", "queue")
    monkeypatch.setattr(NvrxBackend, "_prewarm", None)
    backend = NvrxBackend(60.0, start_worker=False)
    assert started == [] and not backend.worker_ready()  # a save now goes to the in-process fallback
    backend.start_worker()
    backend.start_worker()
    assert started == [1] and backend.worker_ready()
    assert NvrxBackend(60.0).worker_ready() and started == [1, 1]  # by default: at construction


class _Manager:
    """What CheckpointLoop.after_step asks of its manager."""

    committed_step = -1

    def __init__(self) -> None:
        self.calls: list[str] = []

    def start_writers(self) -> None:
        self.calls.append("start_writers")

    def should_save(self, step: int, last_step: int) -> bool:
        return False

    def maybe_finalize(self, blocking: bool = False) -> list[int]:
        self.calls.append("maybe_finalize")
        return []


def test_the_loop_starts_the_writers_after_the_first_step_not_before(tmp_path: Path) -> None:
    manager: Any = _Manager()
    loop = CheckpointLoop(manager, CheckpointConfig(dir=tmp_path), None, rank=0, last_step=9)
    assert manager.calls == []  # building the loop (with the manager, before the restore) starts nothing
    loop.after_step(0, {})
    assert manager.calls[0] == "start_writers"
