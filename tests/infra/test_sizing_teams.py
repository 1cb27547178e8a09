"""Storage sized for the checkpoint cadence at synthesis: `python -m infra.teams` (the first step of `make
synth`) and the CDK app stop a team whose FSx cannot carry its checkpoints with one line naming the team,
the fields and the numbers; a slow reload is a warning; the cadence reaches the chart values (Contract 1)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.config import TeamsConfigError, parse_teams
from infra.trainer_release import trainer_values
from tests.helpers import REPO_ROOT


def team(**over: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "name": "big-model",
        "account": "333333333333",
        "region": "us-east-2",
        "network": {
            "vpc_cidr": "10.2.0.0/16",
            "availability_zones": ["us-east-2a", "us-east-2b"],
            "gpu_availability_zone": "us-east-2a",
        },
        "admin_principal_arns": ["arn:aws:iam::333333333333:role/Admin"],
    }
    base.update(over)
    return base


def write_teams(tmp_path: Path, *teams: dict[str, Any]) -> Path:
    path = tmp_path / "teams.yaml"
    path.write_text(yaml.safe_dump({"teams": list(teams)}))
    return path


def check(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "infra.teams", str(path)],
        cwd=REPO_ROOT,
        env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)),
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


# The case: a 70B model with AdamW state on the smallest, slowest PERSISTENT_2 file system.
SEVENTY_B_ON_1200 = {
    "fsx": {"storage_gib": 1200, "throughput_per_tib": 125},
    "checkpoints": {"model": "70b", "interval_minutes": 60},
}


def test_the_default_teams_file_passes_without_warnings() -> None:
    run = check(REPO_ROOT / "teams.yaml")
    assert run.returncode == 0, run.stderr
    assert run.stderr == ""
    assert "2 team(s) valid" in run.stdout


def test_a_file_system_that_cannot_carry_the_checkpoints_stops_with_one_line(tmp_path: Path) -> None:
    first = team(name="fits", network={**team()["network"], "vpc_cidr": "10.3.0.0/16"})
    run = check(write_teams(tmp_path, first, team(**SEVENTY_B_ON_1200)))
    assert run.returncode == 2
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    line = lines[0]
    assert line.startswith(
        "error: teams[1].checkpoints: team big-model: one checkpoint (846.6 GB) takes 94.1 min"
    )
    for part in (
        "fsx.storage_gib 1200 = 1.2 TiB x fsx.throughput_per_tib 125 MB/s/TiB = 150 MB/s",
        "checkpoint interval is 60.0 min (needs 235 MB/s)",
        "smallest valid: checkpoints.interval_minutes >= 94.1",
        "fsx.throughput_per_tib 250",
        "need 3,942 GiB with 20% headroom, but fsx.storage_gib is 1200",
        "smallest valid: fsx.storage_gib 4800",
    ):
        assert part in line, part


def test_a_file_system_too_small_for_keep_checkpoints(tmp_path: Path) -> None:
    run = check(write_teams(tmp_path, team(checkpoints={"keep": 20})))
    assert run.returncode == 2
    # the loader ends a field's error with its line in the file
    assert re.sub(r" \(line \d+\)$", "", run.stderr.strip()) == (
        "error: teams[0].checkpoints: team big-model: checkpoints.keep 20 checkpoints of 96.4 GB plus the "
        "one being written need 2,356 GiB with 20% headroom, but fsx.storage_gib is 1200; smallest valid: "
        "fsx.storage_gib 2400 or checkpoints.keep 9"
    )
    # The smallest settings the line names pass.
    assert check(write_teams(tmp_path, team(checkpoints={"keep": 9}))).returncode == 0
    assert (
        check(write_teams(tmp_path, team(checkpoints={"keep": 20}, fsx={"storage_gib": 2400}))).returncode
        == 0
    )


def test_a_slow_reload_is_a_warning_line(tmp_path: Path) -> None:
    slow = team(fsx={"storage_gib": 4800, "throughput_per_tib": 125}, checkpoints={"model": "70b"})
    run = check(write_teams(tmp_path, slow))
    assert run.returncode == 0, run.stderr
    (line,) = run.stderr.strip().splitlines()
    assert line.startswith(
        "warning: team big-model: reloading the whole job (846.6 GB at 600 MB/s) takes 23.5 min"
    )
    assert (
        "above checkpoints.reload_budget_minutes 15; fsx.throughput_per_tib 250 would take 11.8 min" in line
    )
    quiet = team(fsx=slow["fsx"], checkpoints={"model": "70b", "reload_budget_minutes": 30})
    assert check(write_teams(tmp_path, quiet)).stderr == ""


@pytest.mark.parametrize(
    ("checkpoints", "expected"),
    [
        (
            {"interval_minutes": 5, "interval_steps": 9},
            "teams[0].checkpoints.interval_steps: give interval_minutes",
        ),
        ({"model": "8b", "parameters": 10}, "teams[0].checkpoints.parameters: give model"),
        ({"model": "405b"}, "teams[0].checkpoints.model: Input should be"),
        ({"keep": "3"}, "teams[0].checkpoints.keep: must be an integer, got '3'"),
        (
            {"step_seconds": 0},
            "teams[0].checkpoints.step_seconds: Input should be greater than or equal to 0.001",
        ),
        ({"cadence": 1}, "teams[0].checkpoints.cadence: unknown key"),
    ],
)
def test_checkpoint_fields_are_typed(checkpoints: dict[str, Any], expected: str) -> None:
    with pytest.raises(TeamsConfigError) as err:
        parse_teams({"teams": [team(checkpoints=checkpoints)]})
    assert str(err.value).startswith(expected), str(err.value)


def test_the_cadence_reaches_the_chart_values(tmp_path: Path, helm_bin: Path) -> None:
    (default,) = parse_teams({"teams": [team()]})
    values = trainer_values(default, "repo", "tag")
    # 30 minutes at 2 s a step; 96.4 GB at 1.2 TiB x 250 MB/s/TiB = 300 MB/s is 321 s: twice that.
    assert {k: values[k] for k in ("preset", "ckptInterval", "ckptKeep", "ckptWriteTimeout")} == {
        "preset": "8b", "ckptInterval": 900, "ckptKeep": 3, "ckptWriteTimeout": 643,
    }  # fmt: skip
    (fast,) = parse_teams({"teams": [team(fsx={"storage_gib": 2400, "throughput_per_tib": 1000})]})
    assert trainer_values(fast, "repo", "tag")["ckptWriteTimeout"] == 600  # never below the chart's
    (slow,) = parse_teams(
        {"teams": [team(fsx={"storage_gib": 4800, "throughput_per_tib": 125},
                        checkpoints={"model": "70b", "interval_steps": 500, "step_seconds": 6, "keep": 2})]}
    )  # fmt: skip
    values = trainer_values(slow, "repo", "tag")
    write_s = slow.storage_sizing.write_s
    assert write_s == pytest.approx(846.6e9 / 600e6, rel=1e-3)
    assert values["preset"] == "70b" and values["ckptInterval"] == 500 and values["ckptKeep"] == 2
    assert values["ckptWriteTimeout"] == -(-2 * write_s // 1)  # twice the sized write, rounded up
    (own,) = parse_teams({"teams": [team(checkpoints={"parameters": 3_000_000_000})]})
    assert "preset" not in trainer_values(own, "repo", "tag")
    # The chart takes them and passes them to the trainer.
    values_file = tmp_path / "values.json"
    values_file.write_text(json.dumps(values))
    run = subprocess.run(
        [str(helm_bin), "template", "t", str(REPO_ROOT / "k8s"), "-f", str(values_file)],
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    for flag in (
        "--preset=70b",
        "--ckpt-interval=500",
        "--ckpt-keep=2",
        f"--ckpt-write-timeout={values['ckptWriteTimeout']}",
    ):
        assert flag in run.stdout, flag


def test_the_cdk_app_stops_on_the_same_line(tmp_path: Path) -> None:
    """app.py as the CDK CLI runs it (`make synth`'s second step) refuses the file before synthesizing."""
    path = write_teams(tmp_path, team(**SEVENTY_B_ON_1200))
    env = dict(
        os.environ,
        PYTHONPATH=str(REPO_ROOT),
        CDK_OUTDIR=str(tmp_path / "out"),
        CDK_CONTEXT_JSON=json.dumps({"teams_file": str(path)}),
        JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION="20",
    )
    run = subprocess.run(
        [sys.executable, "app.py"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert run.returncode == 2
    lines = [ln for ln in run.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0] == check(path).stderr.strip(), run.stderr
    assert not (tmp_path / "out" / "big-model.template.json").exists()


def test_the_synthesized_release_carries_the_cadence(templates: dict[str, dict]) -> None:
    """The real synth of the default teams: the Helm chart resource's values hold the sized cadence."""
    charts = [
        r["Properties"]
        for r in templates["ml-research"]["Resources"].values()
        if r["Type"] == "Custom::AWSCDK-EKS-HelmChart"
    ]
    values = [json.dumps(c.get("Values")) for c in charts]
    assert any('\\"ckptInterval\\":900' in v and '\\"ckptKeep\\":3' in v for v in values), values
