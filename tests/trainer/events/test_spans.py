"""trainer/events/spans.py: the pieces of an attempt's start-up, carried by its `restore` event
(Contract 3)."""

from __future__ import annotations

import json
import time
from pathlib import Path

from trainer.events import spans
from trainer.events.metrics import EventLog


def test_marks_are_consecutive_pieces_and_a_repeated_name_adds_up() -> None:
    spans.begin()
    time.sleep(0.02)
    spans.mark("a")
    spans.mark("b")
    time.sleep(0.02)
    spans.mark("a")
    got = spans.take()
    assert got is not None and list(got) == ["a", "b"]
    assert got["a"] >= 0.04 and got["b"] < 0.02
    assert spans.take() is None, "take stops the clock"
    spans.mark("late")  # after the restore (or without an attempt): ignored
    assert spans.take() is None


def test_the_restore_event_carries_the_spans_of_its_attempt(tmp_path: Path) -> None:
    log = EventLog(tmp_path, 0, local_rank=0)
    spans.begin()
    spans.mark("pg")
    log.emit("restore", step=3, path="p", load_s=0.1, source="shm")
    log.emit("restore", step=3, path="p", load_s=0.1, source="shm")  # a second one: no clock running
    log.close()
    first, second = (json.loads(line) for line in (tmp_path / "events.rank0.jsonl").read_text().splitlines())
    assert list(first["spans"]) == ["pg", "other"]
    assert "spans" not in second
