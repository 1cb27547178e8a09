"""bench/guard.py: a one-repetition pass writes both modes, the guard's own work and the report's section."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from bench.report.guard import guard_section
from tests.helpers import REPO_ROOT


def test_a_short_pass_measures_both_modes_and_the_report_shows_them(tmp_path: Path) -> None:
    out = tmp_path / "guard.json"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT)}
    env.pop("MASTER_PORT", None)
    cmd = [sys.executable, "-m", "bench.guard", "--reps", "2", "--steps", "2", "--out", str(out)]
    done = subprocess.run(cmd, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    res = json.loads(out.read_text())
    assert [r["rep"] for r in res["reps"]] == [0, 1]
    for row in res["reps"]:
        assert row["on"]["step_s"] > 0 and row["off"]["step_s"] > 0
        assert row["parts"]["on"] > 0 and row["parts"]["off"] > 0
    assert res["params"] > 0 and res["overhead"]["n"] == 2 and res["target"] == 0.01
    section = guard_section(res)
    assert section.startswith("## Numerical guard") and "target < 1%" in section
    assert "python -m bench.guard --reps 2 --steps 2" in section
