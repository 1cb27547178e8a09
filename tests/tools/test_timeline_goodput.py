"""The demo's live goodput curve is the exporter's trainer_goodput_ratio replayed at each scrape time."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tools.timeline import draw, goodput_curve
from trainer.events.metrics import read_events, summarize


def _write(out: Path) -> None:
    def ev(name: str, t: float, **fields: object) -> str:
        return json.dumps({"ev": name, "t": t, "rank": 0, "pid": 1, "restart": 0, "iteration": 0, **fields})

    lines = [ev("run_start", 0.0, world_size=1, config={})]
    for step, (t0, t1) in enumerate([(2.0, 3.0), (3.0, 4.0), (8.0, 9.0), (9.0, 10.0)]):
        lines.append(ev("step", t1, step=step, t_start=t0, t_end=t1, loss=1.0, tokens=4))
    lines.append(ev("run_end", 10.5, step=3, status="completed"))
    (out / "events.rank0.jsonl").write_text("\n".join(lines) + "\n")


def test_the_curve_ends_at_the_summary_and_falls_while_nothing_is_kept(tmp_path: Path) -> None:
    _write(tmp_path)
    events, _ = read_events(tmp_path)
    curve = goodput_curve(events, scrape_s=0.5)
    times = [t for t, _ in curve]
    assert times == sorted(times) and times[-1] == 10.5
    assert curve[-1][1] == pytest.approx(summarize(tmp_path)["training_efficiency"])  # 4 s of 10.5 s
    at = dict(curve)
    assert at[4.0] == pytest.approx(2.0 / 4.0)
    assert at[7.5] == pytest.approx(2.0 / 7.5)  # a stall: wall time runs, productive time does not


def test_the_timeline_png_has_the_goodput_panel(tmp_path: Path) -> None:
    _write(tmp_path)
    png = draw(tmp_path, summarize(tmp_path), tmp_path / "timeline.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
