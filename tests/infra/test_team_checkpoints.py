"""The teams file's `checkpoints:` is declared once (sizing/teamfile.py `Checkpoints`); infra's pydantic
wrap (infra/teams/checkpoints.py `TeamCheckpoints`) takes its fields, defaults, bounds and rules from it,
and its errors still name `teams[i].checkpoints.<field>` with the line."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.config import TeamsConfigError, load_teams
from infra.teams.checkpoints import TeamCheckpoints
from sizing import teamfile
from tests.helpers import REPO_ROOT

BASE = yaml.safe_load((REPO_ROOT / "teams.yaml").read_text(encoding="utf-8"))


def test_the_wrap_has_the_declarations_fields_and_defaults() -> None:
    declared = {f.name: f.default for f in dataclasses.fields(teamfile.Checkpoints)}
    assert {name: f.default for name, f in TeamCheckpoints.model_fields.items()} == declared
    assert TeamCheckpoints().declared() == teamfile.Checkpoints()


def _rejected(tmp_path: Path, checkpoints: dict[str, Any]) -> str:
    data = {**BASE, "teams": [{**BASE["teams"][0], "checkpoints": checkpoints}, *BASE["teams"][1:]]}
    path = tmp_path / "teams.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    with pytest.raises(TeamsConfigError) as info:
        load_teams(path)
    lines = path.read_text(encoding="utf-8").splitlines()
    field = next(iter(checkpoints)) if len(checkpoints) == 1 else "interval_steps"
    line = next(i for i, text in enumerate(lines, 1) if text.strip().startswith(f"{field}:"))
    message = str(info.value)
    assert message.endswith(f"(line {line})"), message
    return message


@pytest.mark.parametrize(
    ("checkpoints", "expected"),
    [
        # A bound of the declaration's metadata (keep <= 100), enforced by the wrap.
        ({"keep": 101}, "teams[0].checkpoints.keep: Input should be less than or equal to 100"),
        (
            {"step_seconds": 0.0001},
            "teams[0].checkpoints.step_seconds: Input should be greater than or equal",
        ),
        # A rule between fields, the declaration's own check.
        (
            {"interval_minutes": 5, "interval_steps": 9},
            "teams[0].checkpoints.interval_steps: give interval_minutes or interval_steps, not both",
        ),
        ({"keep": True}, "teams[0].checkpoints.keep: must be an integer, got true"),
    ],
)
def test_errors_name_the_field_and_its_line(
    tmp_path: Path, checkpoints: dict[str, Any], expected: str
) -> None:
    assert _rejected(tmp_path, checkpoints).startswith(expected)


def test_the_planners_reader_applies_the_same_bounds() -> None:
    """The stdlib reader (planner, smoke run) refuses what the wrap refuses, naming the same field."""
    with pytest.raises(teamfile.TeamSizingError, match=r"^checkpoints\.keep: must be <= 100, got 101$"):
        teamfile.Checkpoints.from_mapping({"keep": 101})
    with pytest.raises(teamfile.TeamSizingError, match=r"^checkpoints\.keep: must be an integer, got True$"):
        teamfile.Checkpoints.from_mapping({"keep": True})
