"""Every bad-input case of the teams file fails with one line naming team index and field."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from infra.config import TeamsConfigError, load_teams, parse_teams, select_team
from tests.helpers import REPO_ROOT


def _team(**overrides: Any) -> dict[str, Any]:
    team: dict[str, Any] = {
        "name": "team-b",
        "account": "123456789012",
        "region": "us-east-2",
        "network": {
            "availability_zones": ["us-east-2a", "us-east-2b"],
            "gpu_availability_zone": "us-east-2a",
        },
        "admin_principal_arns": ["arn:aws:iam::123456789012:role/Admin"],
    }
    team.update(copy.deepcopy(overrides))
    return team


def _error(second_team: dict[str, Any]) -> str:
    """Validate [a good team, `second_team`] and return the error line (the bad one is teams[1])."""
    with pytest.raises(TeamsConfigError) as info:
        parse_teams({"teams": [_team(name="team-a"), second_team]})
    message = str(info.value)
    assert "\n" not in message
    return message


def test_checked_in_teams_file_is_valid_and_default_team_first() -> None:
    teams = load_teams(REPO_ROOT / "teams.yaml")
    assert [t.name for t in teams][:1] == ["ml-research"]
    assert len(teams) >= 2
    assert teams[0].gpu_node_group.instance_type == "p5.48xlarge"


def test_defaults_of_a_minimal_team() -> None:
    (team,) = parse_teams({"teams": [_team()]})
    assert team.kubernetes_version == "1.35"
    assert team.endpoint_access == "private"
    assert team.gpu_node_group.instance_type == "p5.48xlarge"
    assert team.gpu_node_group.capacity.type == "on-demand"
    assert (team.fsx.storage_gib, team.fsx.throughput_per_tib) == (1200, 250)
    assert team.effective_gpu_quota == team.gpu_node_group.max_nodes * 8


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(TeamsConfigError, match=r"nope\.yaml: teams file not found$"):
        load_teams(tmp_path / "nope.yaml")


def test_unparsable_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("teams:\n  - name: a\n   account: [\n")
    with pytest.raises(TeamsConfigError, match=r"bad\.yaml: invalid YAML at line \d+, column \d+: "):
        load_teams(path)


def test_top_level_must_hold_teams(tmp_path: Path) -> None:
    path = tmp_path / "list.yaml"
    path.write_text("- name: a\n")
    with pytest.raises(TeamsConfigError, match="expected a mapping with a 'teams' list"):
        load_teams(path)


def test_empty_teams_list() -> None:
    with pytest.raises(TeamsConfigError, match=r"^teams: List should have at least 1 item"):
        parse_teams({"teams": []})


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"colour": "red"}, "teams[1].colour: unknown key"),
        ({"fsx": {"storage_gb": 1200}}, "teams[1].fsx.storage_gb: unknown key"),
        ({"name": "Team_B"}, "teams[1].name: 'Team_B' is not a DNS-1123 label"),
        ({"name": "9lives"}, "teams[1].name: '9lives' is not a DNS-1123 label"),
        ({"name": "x" * 64}, "is not a DNS-1123 label"),
        ({"name": "team-"}, "teams[1].name: 'team-' is not a DNS-1123 label"),
        (
            {"gpu_node_group": {"instance_type": "p3.16xlarge"}},
            "teams[1].gpu_node_group.instance_type: unknown GPU instance type 'p3.16xlarge' (allowed: "
            "p5.48xlarge",
        ),
        (
            {"gpu_node_group": {"min_nodes": 3, "desired_nodes": 2, "max_nodes": 4}},
            "teams[1].gpu_node_group.desired_nodes: desired_nodes 2 is below min_nodes 3",
        ),
        (
            {"gpu_node_group": {"desired_nodes": 5, "max_nodes": 4}},
            "teams[1].gpu_node_group.desired_nodes: desired_nodes 5 is above max_nodes 4",
        ),
        (
            {"system_node_group": {"min_nodes": 3, "desired_nodes": 2}},
            "teams[1].system_node_group.desired_nodes: desired_nodes 2 is below min_nodes 3",
        ),
        (
            {"fsx": {"storage_gib": 3600}},
            "teams[1].fsx.storage_gib: PERSISTENT_2 needs 1200 or a multiple of 2400 (got 3600)",
        ),
        (
            {"fsx": {"storage_gib": 600}},
            "teams[1].fsx.storage_gib: Input should be greater than or equal to 1200",
        ),
        (
            {"fsx": {"throughput_per_tib": 200}},
            "teams[1].fsx.throughput_per_tib: PERSISTENT_2 throughput per TiB must be one of 125, 250, 500, "
            "1000",
        ),
        ({"fsx": {"s3_path": "bucket/prefix"}}, "teams[1].fsx.s3_path: 'bucket/prefix' is not an S3 path"),
        (
            {"admin_principal_arns": ["arn:aws:iam::123456789012:role/Ok", "arn:aws:iam::12345:role/Short"]},
            "teams[1].admin_principal_arns[1]: 'arn:aws:iam::12345:role/Short' is not an IAM role or user "
            "ARN",
        ),
        ({"admin_principal_arns": ["arn:aws:s3:::bucket"]}, "teams[1].admin_principal_arns[0]: "),
        ({"admin_principal_arns": []}, "teams[1].admin_principal_arns: List should have at least 1 item"),
        (
            {"gpu_node_group": {"capacity": {"type": "reservation", "id": "cr-123"}}},
            "teams[1].gpu_node_group.capacity.id: 'cr-123' is not a capacity reservation or capacity "
            "block id",
        ),
        (
            {"gpu_node_group": {"capacity": {"type": "capacity-block", "id": "cb-0123456789abcdef0"}}},
            "teams[1].gpu_node_group.capacity.id: 'cb-0123456789abcdef0' is not a capacity reservation",
        ),
        (
            {"gpu_node_group": {"capacity": {"type": "reservation"}}},
            "teams[1].gpu_node_group.capacity.id: capacity type reservation needs the cr-... id",
        ),
        (
            {"gpu_node_group": {"capacity": {"type": "on-demand", "id": "cr-0123456789abcdef0"}}},
            "teams[1].gpu_node_group.capacity.id: on-demand capacity takes no id",
        ),
        (
            {"gpu_node_group": {"capacity": {"type": "spot"}}},
            "teams[1].gpu_node_group.capacity.type: Input should be",
        ),
        (
            {"gpu_node_group": {"max_nodes": 2, "desired_nodes": 2}, "gpu_quota": 24},
            "teams[1].gpu_quota: 24 GPUs is above what the GPU node group can hold (2 x 8 = 16)",
        ),
        (
            {"gpu_node_group": {"max_nodes": 4, "desired_nodes": 2}, "gpu_quota": 8},
            "teams[1].gpu_quota: 8 GPUs is below what the trainer release requests (2 x 8 = 16)",
        ),
        ({"account": 123456789012}, "teams[1].account: quote the account id"),
        ({"account": "1234"}, "teams[1].account: '1234' is not a 12-digit AWS account id"),
        ({"region": "mars-1"}, "teams[1].region: 'mars-1' is not an AWS region name"),
        ({"kubernetes_version": 1.35}, "teams[1].kubernetes_version: quote the version"),
        ({"kubernetes_version": "1.29"}, "teams[1].kubernetes_version: '1.29' is not supported"),
        (
            {
                "network": {
                    "availability_zones": ["us-east-2a", "us-west-2b"],
                    "gpu_availability_zone": "us-east-2a",
                }
            },
            "teams[1].network.availability_zones[1]: 'us-west-2b' is not an availability zone of us-east-2",
        ),
        (
            {
                "network": {
                    "availability_zones": ["us-east-2a", "us-east-2b"],
                    "gpu_availability_zone": "us-east-2c",
                }
            },
            "teams[1].network.gpu_availability_zone: 'us-east-2c' is not one of availability_zones",
        ),
        (
            {"network": {"availability_zones": ["us-east-2a"], "gpu_availability_zone": "us-east-2a"}},
            "teams[1].network.availability_zones: List should have at least 2 items",
        ),
        (
            {
                "network": {
                    "availability_zones": ["us-east-2a", "us-east-2b"],
                    "gpu_availability_zone": "us-east-2a",
                    "vpc_cidr": "10.0.0.0/20",
                }
            },
            "teams[1].network.vpc_cidr: 10.0.0.0/20 must be a private IPv4 /16",
        ),
        (
            {"network": {"availability_zones": ["us-east-2a", "us-east-2b"]}},
            "teams[1].network.gpu_availability_zone: required field is missing",
        ),
        (
            {"endpoint_access": "public_and_private"},
            "teams[1].endpoint_public_cidrs: a public endpoint must be restricted to CIDRs",
        ),
        (
            {"endpoint_access": "public_and_private", "endpoint_public_cidrs": ["0.0.0.0/0"]},
            "teams[1].endpoint_public_cidrs: 0.0.0.0/0 would open the API server to the internet",
        ),
        (
            {"endpoint_access": "public"},
            "teams[1].endpoint_access: Input should be 'private' or 'public_and_private'",
        ),
        (
            {"endpoint_public_cidrs": ["203.0.113.0/24"]},
            "teams[1].endpoint_public_cidrs: only valid with endpoint_access: public_and_private",
        ),
    ],
)
def test_bad_value_names_team_and_field(overrides: dict[str, Any], expected: str) -> None:
    assert expected in _error(_team(**overrides))


def test_missing_required_field() -> None:
    team = _team()
    del team["account"]
    assert _error(team) == "teams[1].account: required field is missing"


def test_duplicate_team_names() -> None:
    assert _error(_team(name="team-a")) == "teams[1].name: duplicate team name 'team-a' (also teams[0])"


def test_several_errors_report_the_first_and_count_the_rest() -> None:
    message = _error(_team(colour="red", fsx={"storage_gib": 1300}))
    assert message.startswith("teams[1].")
    assert message.endswith("(and 1 more)")


def test_select_team() -> None:
    teams = parse_teams({"teams": [_team(name="team-a"), _team()]})
    assert [t.name for t in select_team(teams, "team-b")] == ["team-b"]
    assert select_team(teams, None) == teams
    with pytest.raises(TeamsConfigError, match=r"^team=nope: no such team \(teams: team-a, team-b\)$"):
        select_team(teams, "nope")
