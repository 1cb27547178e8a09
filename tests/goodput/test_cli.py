"""The planner's command line: tier specs, text/JSON output, the plot, errors as exit status 2."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from goodput import PlanError, Tier
from goodput.cli import main
from goodput.tiers import parse_tier_spec
from tests.helpers import REPO_ROOT


def test_tier_spec_parsing():
    tier = parse_tier_spec("in-job:share=0.5:mttr=12.5:rollback=memory").tier()
    assert tier == Tier("in-job", 0.5, 12.5, "memory")
    with pytest.raises(PlanError, match="rollback"):
        parse_tier_spec("x:share=1:mttr=1:rollback=disk")
    with pytest.raises(PlanError, match="mttr"):
        parse_tier_spec("x:share=1")


def test_cli_prints_plan_and_writes_plot(tmp_path, capsys):
    png = tmp_path / "scale.png"
    rc = main(["--nodes", "128", "--profile", "llama3-405b", "--stall", "5", "--json", "--plot", str(png)])
    assert rc == 0
    out = json.loads(capsys.readouterr().out)
    assert out["gpus"] == 1024
    assert out["efficiency"] > out["baseline"]["efficiency"]
    assert out["interval_optimal_s"] == pytest.approx(out["plan"]["interval_s"])
    assert png.stat().st_size > 10_000
    assert main(["--tier", "a:share=0.4:mttr=1"]) == 2
    assert "shares must sum to 1" in capsys.readouterr().err


def test_python_dash_m_goodput_runs_the_cli() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "goodput", "--nodes", "16", "--json"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["gpus"] == 128
    bad = subprocess.run(
        [sys.executable, "-m", "goodput", "--nodes", "0"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and "nodes must be >= 1" in bad.stderr
