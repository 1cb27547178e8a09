"""bench.scale at tiny sizes: every table has one row per size, the fits work, the report renders."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from bench import scale
from bench.report.scale import TABLES, scale_plot, scale_section


@pytest.fixture(scope="module")
def tiny() -> dict[str, Any]:
    return scale.run("tiny")


def test_every_table_has_a_row_per_size_and_every_series_a_fit(tiny: dict[str, Any]) -> None:
    sizes = scale.SIZES["tiny"]
    t = tiny["tables"]
    assert [r["nodes"] for r in t["rendezvous"]] == list(sizes["nodes"])
    assert [r["nodes"] for r in t["liveness"]] == list(sizes["nodes"])
    assert [r["ranks"] for r in t["restore"]] == [n * scale.RANKS_PER_NODE for n in sizes["nodes"]]
    assert [r["ranks"] for r in t["exporter_ranks"]] == list(sizes["ranks"])
    assert [r["steps"] for r in t["exporter_steps"]] == list(sizes["steps"])
    assert [r["ranks"] for r in t["event_bytes"]] == list(sizes["ranks"])
    assert {f["series"] for f in tiny["fits"]} == {s[0] for s in scale.SERIES}
    assert all(f["exponent"] is not None and math.isfinite(f["exponent"]) for f in tiny["fits"])
    by = {f["series"]: f for f in tiny["fits"]}
    # What is counted, not timed, has its growth pinned down even at tiny sizes:
    assert by["restore agreement bytes received per rank"]["exponent"] == pytest.approx(1.0)
    assert by["rendezvous store operations"]["exponent"] == pytest.approx(1.0, abs=0.15)
    assert by["exporter lines per scrape vs steps"]["exponent"] == pytest.approx(0.0, abs=0.05)
    assert by["former exporter lines per scrape vs steps"]["exponent"] > 0.8
    assert by["event bytes per step per node vs ranks"]["exponent"] < 0.1  # constant per node
    for row in t["event_bytes"]:  # every rank writing snapshot and replica events
        assert row["bytes_per_step_per_node_before"] > 4 * row["bytes_per_step_per_node_now"]
    # The rendezvous's hosts see every node's slot: N packed participants in the close's snapshot.
    for row in t["rendezvous"]:
        assert row["snapshot_bytes"] == row["nodes"] * scale.PARTICIPANT_BYTES
        assert row["round_s"] >= 2 * scale.HOST_POLL_S


def test_the_fit_recovers_a_known_power_law() -> None:
    f = scale.fit([8, 64, 512], [3 * 8**1.5, 3 * 64**1.5, 3 * 512**1.5])
    assert f is not None and f["k"] == pytest.approx(1.5) and f["a"] == pytest.approx(3.0)
    assert scale.project(f, 2048) == pytest.approx(3 * 2048**1.5)
    assert scale.fit([8], [1.0]) is None and scale.fit([8, 8], [1.0, 2.0]) is None


def test_the_report_section_and_plot(tiny: dict[str, Any], tmp_path: Path) -> None:
    md = scale_section(tiny)
    assert "2,048 nodes" in md and "exponent k" in md
    for _, title, _ in TABLES:
        assert f"**{title}**" in md
    png = scale_plot(tiny, tmp_path / "scale.png")
    assert png is not None and png.stat().st_size > 10_000
