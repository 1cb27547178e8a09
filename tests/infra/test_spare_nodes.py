"""Hot spares in the teams file: `gpu_node_group.spare_nodes` sizes the node group, the quota check and
the trainer release (nodes + spareNodes pods), and a bad value names its field."""

from __future__ import annotations

from typing import Any

import pytest

from infra.config import TeamsConfigError, parse_teams
from tests.infra._synth import SynthResult
from tests.infra.helpers import helm_releases, resources


def _team(**gpu: Any) -> dict[str, Any]:
    return {
        "name": "team-s",
        "account": "123456789012",
        "region": "us-east-2",
        "network": {
            "availability_zones": ["us-east-2a", "us-east-2b"],
            "gpu_availability_zone": "us-east-2a",
        },
        "admin_principal_arns": ["arn:aws:iam::123456789012:role/Admin"],
        "gpu_node_group": gpu,
    }


def _error(team: dict[str, Any]) -> str:
    with pytest.raises(TeamsConfigError) as info:
        parse_teams({"teams": [team]})
    return str(info.value)


def test_spares_add_to_the_node_count() -> None:
    (team,) = parse_teams({"teams": [_team(desired_nodes=2, spare_nodes=1, max_nodes=3)]})
    assert team.gpu_node_group.node_count == 3
    (plain,) = parse_teams({"teams": [_team(desired_nodes=2, max_nodes=2)]})
    assert plain.gpu_node_group.spare_nodes == 0 and plain.gpu_node_group.node_count == 2


def test_bad_spares_name_the_field() -> None:
    assert _error(_team(desired_nodes=2, spare_nodes=1, max_nodes=2)) == (
        "teams[0].gpu_node_group.spare_nodes: desired_nodes 2 + spare_nodes 1 is above max_nodes 2"
    )
    assert "teams[0].gpu_node_group.spare_nodes" in _error(_team(spare_nodes=-1))


def test_quota_must_cover_the_spares() -> None:
    team = _team(desired_nodes=2, spare_nodes=1, max_nodes=4)
    assert _error({**team, "gpu_quota": 16}) == (
        "teams[0].gpu_quota: 16 GPUs is below what the trainer release requests (3 x 8 = 24)"
    )
    parse_teams({"teams": [{**team, "gpu_quota": 24}]})


def test_synthesized_node_group_and_release_carry_the_spares(synth: SynthResult, templates: dict) -> None:
    checked = 0
    for name, team in synth.teams.items():
        config = team.gpu_node_group
        (nodegroup,) = [
            r
            for r in resources(templates[name], "AWS::EKS::Nodegroup")
            if r["Properties"].get("NodegroupName") == f"{name}-gpu"
        ]
        assert nodegroup["Properties"]["ScalingConfig"]["DesiredSize"] == config.node_count
        releases = helm_releases(templates[name])
        if "trainer" in releases:
            values = releases["trainer"]["Values"]
            assert (values["nodes"], values["spareNodes"]) == (config.desired_nodes, config.spare_nodes)
            checked += config.spare_nodes > 0
    assert checked, "no team of the synthesized app has spare nodes"
