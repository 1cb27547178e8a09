"""trainer.checkpoint.storage_probe against a local directory: what it writes it reads back, it cleans up, it
stops at its time limit, several at once line up on --start-at, and bad options end with one line (exit 2)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT
from trainer.checkpoint import storage_probe


def run_probe(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "trainer.checkpoint.storage_probe", *args],
        cwd=REPO_ROOT,
        env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)),
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def test_writes_reads_back_and_cleans_up(tmp_path: Path) -> None:
    target = tmp_path / "fsx" / "probe"
    run = run_probe(f"--dir={target}", "--bytes=12345679", "--files=3", "--expect-mbps=50", "--node=n7")
    assert run.returncode == 0, run.stderr
    (line,) = run.stdout.splitlines()
    r = json.loads(line)
    assert r["probe"] == "storage" and r["node"] == "n7" and r["files"] == 3
    assert r["bytes_written"] == r["bytes_read"] == 3 * 12345679  # every byte back, odd size included
    assert r["write_mbps"] == pytest.approx(r["bytes_written"] / 1e6 / r["write_s"], rel=1e-3)
    assert r["read_mbps"] > 0 and r["expect_mbps"] == 50
    assert r["cache"] in ("o_direct", "fadvise") and r["time_limited"] is False
    assert not target.exists()  # its files and the directory it created are gone
    assert (tmp_path / "fsx").exists()


def test_the_data_is_not_compressible(tmp_path: Path) -> None:
    """FSx compresses with LZ4: a probe writing zeros would measure the compressor, not the disks."""
    import zlib

    path = tmp_path / "f.bin"
    result, lock = storage_probe.PhaseResult(), threading.Lock()
    storage_probe._write_file(path, 3 * storage_probe.BLOCK, time.monotonic() + 60, result, lock)
    data = path.read_bytes()
    assert len(data) == result.nbytes == 3 * storage_probe.BLOCK
    assert len(zlib.compress(data, 1)) > 0.99 * len(data)
    blocks = [data[i : i + storage_probe.BLOCK] for i in range(0, len(data), storage_probe.BLOCK)]
    assert len(set(blocks)) == 3  # no block repeats another


def test_stops_at_the_time_limit(tmp_path: Path) -> None:
    start = time.monotonic()
    r = storage_probe.probe(tmp_path / "d", 4 * 10**9, 1, 0.3, "n0")
    assert time.monotonic() - start < 10
    assert r["time_limited"] is True
    assert 0 < r["bytes_written"] < 4 * 10**9
    assert list(tmp_path.iterdir()) == []


def test_several_probes_start_together(tmp_path: Path) -> None:
    start_at = time.time() + 2.0
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "trainer.checkpoint.storage_probe",
                f"--dir={tmp_path / str(n)}",
                "--bytes=4000000",
                f"--start-at={start_at}",
                f"--node=n{n}",
            ],
            cwd=REPO_ROOT,
            env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)),
            stdout=subprocess.PIPE,
            text=True,
        )
        for n in range(3)
    ]
    lines = [json.loads(p.communicate(timeout=60)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert sorted(r["node"] for r in lines) == ["n0", "n1", "n2"]
    assert time.time() >= start_at


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--bytes=0"], "storage probe: --bytes: must be >= 1, got 0"),
        (["--bytes=1e3"], "storage probe: --bytes: expected an integer, got '1e3'"),
        (["--bytes=10", "--files=65"], "storage probe: --files: at most 64, got 65"),
        (
            ["--bytes=10", "--time-limit=inf"],
            "storage probe: --time-limit: must be a finite number > 0, got inf",
        ),
        (
            ["--bytes=10", "--expect-mbps=-1"],
            "storage probe: --expect-mbps: must be a finite number > 0, got -1",
        ),
        (["--bytes=10000000000000000"], "do not fit in"),
        (["--bytes=10", "--dir=/proc/nope"], "storage probe: --dir: /proc/nope:"),
    ],
)
def test_bad_options_end_with_one_line(tmp_path: Path, args: list[str], message: str) -> None:
    run = run_probe(f"--dir={tmp_path / 'probe'}", *args)
    assert run.returncode == 2
    (line,) = run.stderr.strip().splitlines()
    assert message in line
    assert list(tmp_path.iterdir()) == []


def test_needs_no_torch() -> None:
    code = "import sys, trainer.checkpoint.storage_probe; assert 'torch' not in sys.modules"
    assert subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, check=False).returncode == 0
