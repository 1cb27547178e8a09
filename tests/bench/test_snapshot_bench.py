"""bench.snapshot: one small real measurement, with every figure the report needs and consistent."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import snapshot


def test_one_size_measures_stall_floor_memory_and_every_restore_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # main() sets MASTER_ADDR/MASTER_PORT for its process group: monkeypatch puts them back afterwards
    monkeypatch.setenv("MASTER_ADDR", "unset")
    monkeypatch.setenv("MASTER_PORT", "0")
    out = tmp_path / "snapshot.json"
    (tmp_path / "shm").mkdir()
    argv = ["--mib", "6", "--reps", "2", "--dir", str(tmp_path / "shm"), "--out", str(out)]
    assert snapshot.main(argv) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert row["mib"] == 6 and 6 * 2**20 <= row["payload_bytes"] < 7 * 2**20
    assert row["host_bytes"] > 2 * row["payload_bytes"]
    assert row["blocked_s"]["n"] == 2 and row["blocked_s"]["median"] > 0 and row["floor_s"]["median"] > 0
    assert set(row["restore_s"]) == {"memory", "shm", "fsx"}
    assert all(r["median"] > 0 for r in row["restore_s"].values())
    assert set(row["restore_over_floor"]) == {"memory", "shm"}
    assert all(x > 0 for x in row["restore_over_floor"].values())
    assert list((tmp_path / "shm").iterdir()) == []  # the slots are removed afterwards


def test_bad_arguments_are_refused(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        snapshot.main(["--mib", "1", "--out", str(tmp_path / "x.json")])
