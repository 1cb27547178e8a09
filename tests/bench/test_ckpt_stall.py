"""bench/ckpt_stall.py: the chart's default durable save (nvrx, written from the step's snapshot) is
measured beside the floor, its snapshot part reported apart (a save blocks no longer than the snapshot it
reuses, plus its hold of the slot)."""

from __future__ import annotations

import pytest

from bench import ckpt_stall

pytestmark = pytest.mark.slow


def test_a_save_from_the_steps_snapshot_is_measured_with_its_snapshot_part() -> None:
    res = ckpt_stall.measure([8], reps=2, world_size=1, modes=["nvrx-from-snapshot"])
    size = res["raw"]["sizes"]["8"]["nvrx-from-snapshot"]
    assert len(size["blocked_s"]) == len(size["snapshot_s"]) == 2
    # what the loop waits for holds the snapshot (a part of it), and the save commits after it
    assert all(0 < s <= b for s, b in zip(size["snapshot_s"], size["blocked_s"], strict=True))
    assert all(c >= b for c, b in zip(size["commit_s"], size["blocked_s"], strict=True))
    modes = [r["mode"] for r in res["rows"]]
    assert modes == ["floor (1 copy)", "nvrx-from-snapshot"]
