"""`python -m goodput --teams FILE --team NAME`: the planner takes the team's nodes, step time, interval,
save stall and reload time from the storage sizing, so its efficiency figure is the team's own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from goodput.cli import main
from goodput.inputs import NODE_LOSS_MTTR_S
from sizing import size
from sizing.teamfile import find_team, team_inputs
from tests.helpers import REPO_ROOT

TEAMS = REPO_ROOT / "teams.yaml"


def plan_of(capsys: pytest.CaptureFixture[str], *argv: str) -> dict:
    assert main([*argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def sizing_of(path: Path, name: str):
    return size(team_inputs(find_team(yaml.safe_load(path.read_text()), name)))


def test_the_plan_is_the_teams_own(capsys: pytest.CaptureFixture[str]) -> None:
    sizing = sizing_of(TEAMS, "ml-research")
    out = plan_of(capsys, "--teams", str(TEAMS), "--team", "ml-research")
    plan = out["plan"]
    assert (plan["nodes"], plan["gpus_per_node"]) == (2, 8)
    assert plan["stall_s"] == pytest.approx(sizing.stall_s)
    assert plan["interval_s"] == pytest.approx(1800.0)  # 900 steps of 2 s
    assert out["snapshots"]["step_s"] == 2.0
    tiers = {t["name"]: t for t in plan["tiers"]}
    assert tiers["job-restart"]["mttr_s"] == pytest.approx(840 + sizing.reload_s)
    assert tiers["node-loss"]["fallback_mttr_s"] == pytest.approx(NODE_LOSS_MTTR_S + sizing.reload_s)
    assert out["team"]["name"] == "ml-research"
    assert out["team"]["sizing"]["reload_s"] == pytest.approx(sizing.reload_s)


def test_options_on_the_command_line_win(capsys: pytest.CaptureFixture[str]) -> None:
    out = plan_of(
        capsys, "--teams", str(TEAMS), "--nodes", "16", "--stall", "3", "--tier", "a:share=1:mttr=5"
    )
    assert out["plan"]["nodes"] == 16 and out["plan"]["stall_s"] == 3.0
    assert [t["name"] for t in out["plan"]["tiers"]] == ["a"]
    assert out["team"]["name"] == "ml-research"  # the first team without --team


def test_a_slower_file_system_gives_the_team_a_lower_efficiency(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = yaml.safe_load(TEAMS.read_text())
    team = data["teams"][0]
    team["checkpoints"] = {"model": "70b", "interval_minutes": 120}
    team["fsx"] = {"storage_gib": 4800, "throughput_per_tib": 1000}
    fast = tmp_path / "fast.yaml"
    fast.write_text(yaml.safe_dump(data))
    team["fsx"] = {"storage_gib": 4800, "throughput_per_tib": 125}
    slow = tmp_path / "slow.yaml"
    slow.write_text(yaml.safe_dump(data))
    rate = ("--rate-per-gpu-hour", "0.01")
    quick = plan_of(capsys, "--teams", str(fast), *rate)
    crawl = plan_of(capsys, "--teams", str(slow), *rate)
    # 4.8 TiB x 1000 MB/s/TiB is capped by the 2 nodes' clients (2 x 2000 MB/s); x 125 gives 600 MB/s.
    assert quick["team"]["sizing"]["durable_mbps"] == pytest.approx(4000)
    assert crawl["team"]["sizing"]["durable_mbps"] == pytest.approx(600)
    assert crawl["team"]["sizing"]["reload_s"] == pytest.approx(
        quick["team"]["sizing"]["reload_s"] * 4000 / 600
    )
    assert crawl["efficiency"] < quick["efficiency"]
    assert main(["--teams", str(slow), *rate]) == 0
    text = capsys.readouterr().out
    assert "team               ml-research (" in text and "whole-job reload 1411 s at 600 MB/s" in text
    assert "  storage warning: reloading the whole job" in text


def test_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--team", "ml-research"]) == 2
    assert capsys.readouterr().err.strip() == "error: --team needs --teams (the teams file)"
    assert main(["--teams", str(TEAMS), "--team", "nope"]) == 2
    assert "no such team (teams: ml-research, llm-platform)" in capsys.readouterr().err
    (tmp_path / "bad.yaml").write_text("teams: [\n")
    assert main(["--teams", str(tmp_path / "bad.yaml")]) == 2
    assert capsys.readouterr().err.startswith(f"error: --teams {tmp_path / 'bad.yaml'}: invalid YAML")


def test_a_scalar_yaml_11_and_12_read_differently_is_refused_as_infra_refuses_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # `010` is 8 to PyYAML (YAML 1.1) and 10 to YAML 1.2: the planner must not plan 8 nodes for a team
    # whose teams check refuses the file.
    text = TEAMS.read_text().replace("desired_nodes: 2", "desired_nodes: 010", 1)
    assert "desired_nodes: 010" in text
    (tmp_path / "octal.yaml").write_text(text)
    assert main(["--teams", str(tmp_path / "octal.yaml"), "--team", "ml-research"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "desired_nodes" in err and "(line " in err, err
