"""The report's snapshot section: bench.snapshot's figures next to the durable save and the floor."""

from __future__ import annotations

import json

from bench import report
from bench.report.snapshots import snapshots_section


def _spread(median, lo, hi, n=3):
    return {"median": median, "min": lo, "max": hi, "n": n}


def _snapshot():
    row = {
        "mib": 64,
        "payload_bytes": 64 * 2**20,
        "host_bytes": 2 * (64 * 2**20 + 4096),
        "floor_s": _spread(0.010, 0.009, 0.012),
        "blocked_s": _spread(0.012, 0.011, 0.020),
        "blocked_over_floor": 1.2,
        "commit_s": _spread(0.030, 0.028, 0.040),
        "restore_s": {
            "memory": _spread(0.1, 0.1, 0.2),
            "shm": _spread(0.2, 0.2, 0.3),
            "fsx": _spread(0.5, 0.4, 0.6),
        },
    }
    big = row | {"mib": 256, "blocked_over_floor": 1.8}
    faults = [
        {
            "scenario": "exception/tier1",
            "ok": True,
            "restored_from": "memory",
            "steps_recomputed": 0,
            "mttr_s": 0.3,
        },
        {
            "scenario": "exception/tier1",
            "ok": True,
            "restored_from": "memory",
            "steps_recomputed": 1,
            "mttr_s": 0.5,
        },
        {
            "scenario": "sigkill/tier2",
            "ok": False,
            "restored_from": None,
            "steps_recomputed": None,
            "mttr_s": None,
        },
        {
            "scenario": "sigkill/tier2",
            "ok": True,
            "restored_from": "shm",
            "steps_recomputed": 0,
            "mttr_s": 3.0,
        },
    ]
    return {"rows": [row, big], "faults": faults, "config": {"reps": 3}, "note": "one CPU rank"}


def test_restores_from_host_memory_are_set_against_the_floor_beside_them():
    snap = _snapshot()
    snap["rows"][0]["restore_over_floor"] = {"memory": 1.4, "shm": 3.2}
    snap["rows"][1]["restore_over_floor"] = {"memory": 2.3, "shm": 3.5}
    text = snapshots_section(snap, _stall())
    assert "| 0.100 s (0.100-0.200), x1.40 | 0.200 s (0.200-0.300), x3.20 | 0.500 s (0.400-0.600) |" in text
    assert "| 0.100 s (0.100-0.200), x2.30 (over 2) | 0.200 s (0.200-0.300), x3.50 |" in text
    assert "restore from memory <= 2x" in text


def _stall():
    return {
        "rows": [{"MiB/rank": 64, "mode": "nvrx", "blocked_s": _spread(0.049, 0.039, 0.059), "x floor": 6.06}]
    }


def test_section_puts_snapshot_and_durable_save_next_to_the_floor():
    text = snapshots_section(_snapshot(), _stall())
    assert (
        "| 64 | 10.0 ms (9.0-12.0) | 12.0 ms (11.0-20.0) | 1.20 | 30.0 ms (28.0-40.0) | 49.0 ms (39.0-59.0) "
        "| 6.06 | 128 MiB | 0.100 s (0.100-0.200) | 0.200 s (0.200-0.300) | 0.500 s (0.400-0.600) |"
    ) in text
    assert "| 256 | 10.0 ms (9.0-12.0) | 12.0 ms (11.0-20.0) | 1.80 (over 1.5) |" in text  # misses the target
    assert "| 256 |" in text and "| - | - | 128 MiB |" in text  # no durable save measured at 256 MiB
    assert "| `exception/tier1` | 2/2 | memory | 0 (0-1) | 0.40 s (0.30-0.50) |" in text
    assert "| `sigkill/tier2` | 1/2 | shm | 0 | 3.00 s |" in text


def test_report_includes_the_section_when_the_result_exists(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    assert "In-memory snapshots" not in report.build(results)
    (results / "snapshot.json").write_text(json.dumps(_snapshot() | {"faults": []}))
    body = report.build(results)
    assert "### In-memory snapshots" in body
    assert "not measured in this run" in body
