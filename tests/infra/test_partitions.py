"""China and GovCloud teams synthesize with cdk-nag clean (the acknowledgements follow the region's
partition), and a team name of the longest allowed length keeps every derived name within 63 characters."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from infra.teams.aws_rules import MAX_DERIVED_NAME, MAX_TEAM_NAME
from tests.helpers import REPO_ROOT

os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

LONG_NAME = "china-" + "x" * (MAX_TEAM_NAME - len("china-"))
TEAMS: dict[str, Any] = {
    "teams": [
        {
            "name": LONG_NAME,
            "account": "555555555555",
            "region": "cn-north-1",
            "network": {
                "availability_zones": ["cn-north-1a", "cn-north-1b"],
                "gpu_availability_zone": "cn-north-1a",
            },
            "admin_principal_arns": ["arn:aws-cn:iam::555555555555:role/Admin"],
            "fsx": {"s3_path": "s3://china-data-555555555555/x"},
        },
        {
            "name": "gov",
            "account": "666666666666",
            "region": "us-gov-west-1",
            "network": {
                "availability_zones": ["us-gov-west-1a", "us-gov-west-1b"],
                "gpu_availability_zone": "us-gov-west-1b",
            },
            "admin_principal_arns": ["arn:aws-us-gov:iam::666666666666:role/Admin"],
        },
    ]
}


@pytest.fixture(scope="module")
def outdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from aws_cdk import App

    from infra.app_builder import AppOptions, build_app, cdk_json_context
    from infra.config import parse_teams

    out = tmp_path_factory.mktemp("partitions") / "cdk.out"
    app = App(outdir=str(out), context=cdk_json_context())
    build_app(app, parse_teams(TEAMS), AppOptions(chart_dir=REPO_ROOT / "k8s", image_dir=REPO_ROOT, nag=True))
    app.synth()  # raises with the findings if an acknowledgement does not match the partition
    return out


def test_long_name_is_the_limit() -> None:
    assert len(LONG_NAME) == MAX_TEAM_NAME


def test_china_and_govcloud_synthesize_with_partition_arns(outdir: Path) -> None:
    for name, partition in ((LONG_NAME, "aws-cn"), ("gov", "aws-us-gov")):
        template = (outdir / f"{name}.template.json").read_text()
        assert f"arn:{partition}:" in template
        assert "arn:aws:" not in template


def test_derived_names_stay_within_63(outdir: Path) -> None:
    template = json.loads((outdir / f"{LONG_NAME}.template.json").read_text())
    nodegroups = [
        r["Properties"]["NodegroupName"]
        for r in template["Resources"].values()
        if r["Type"] == "AWS::EKS::Nodegroup"
    ]
    assert len(nodegroups) == 2
    assert max(map(len, nodegroups)) == MAX_DERIVED_NAME
