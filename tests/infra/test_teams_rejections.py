"""The teams file, one file per case: each input that would be read as something other than what was written,
or that AWS would refuse at deploy time, fails `load_teams` with one line naming the field."""

from __future__ import annotations

import copy
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.config import TeamsConfigError, load_teams
from tests.helpers import REPO_ROOT

BASE_TEXT = (REPO_ROOT / "teams.yaml").read_text(encoding="utf-8")
BASE = yaml.safe_load(BASE_TEXT)


def _rejection(path: Path) -> str:
    with pytest.raises(TeamsConfigError) as info:
        load_teams(path)
    message = str(info.value)
    assert "\n" not in message
    return message


# Text-level cases: what only YAML syntax can express (the edit is applied to the checked-in teams.yaml).
TEXT_CASES: list[tuple[str, Callable[[str], str], str]] = [
    (
        "duplicate fsx block",
        lambda t: t.replace(
            "    gpu_quota: 32\n", "    gpu_quota: 32\n    fsx:\n      storage_gib: 1200\n", 1
        ),
        "invalid YAML at line 34, column 5: duplicate key 'fsx' (first at line 28; the second would silently",
    ),
    (
        "duplicate top-level key",
        lambda t: t + "teams: []\n",
        "duplicate key 'teams' (first at line 3",
    ),
    (
        "block scalar name",
        lambda t: t.replace("  - name: ml-research\n", "  - name: |\n      ml-research\n", 1),
        "teams[0].name: 'ml-research\\n' starts or ends with a line break (a `|` block scalar keeps",
    ),
    (
        "block scalar ARN",
        lambda t: t.replace(
            "      - arn:aws:iam::111111111111:role/MlResearchAdmin\n",
            "      - |\n        arn:aws:iam::111111111111:role/MlResearchAdmin\n",
            1,
        ),
        "teams[0].admin_principal_arns[0]: 'arn:aws:iam::111111111111:role/MlResearchAdmin\\n' starts",
    ),
    (
        "block scalar reservation id",
        lambda t: t.replace(
            "        id: cr-0123456789abcdef0\n", "        id: |\n          cr-0123456789abcdef0\n"
        ),
        "teams[1].gpu_node_group.capacity.id: 'cr-0123456789abcdef0\\n' starts or ends with a line break",
    ),
    (
        "block scalar S3 path",
        lambda t: t.replace(
            "      s3_path: s3://ml-research-checkpoints-111111111111/exports\n",
            "      s3_path: >\n        s3://ml-research-checkpoints-111111111111/exports\n",
        ),
        "teams[0].fsx.s3_path: 's3://ml-research-checkpoints-111111111111/exports\\n' starts or ends",
    ),
    (
        "account with trailing newline",
        lambda t: t.replace('    account: "111111111111"\n', '    account: "111111111111\\n"\n'),
        "teams[0].account: '111111111111\\n' starts or ends with a line break",
    ),
    (
        "name with surrounding space",
        lambda t: t.replace("  - name: llm-platform\n", '  - name: " llm-platform"\n'),
        "teams[1].name: ' llm-platform' starts or ends with whitespace",
    ),
    (
        "tab inside a value",
        lambda t: t.replace("    region: us-west-2\n", '    region: "us-west\\t2"\n'),
        "teams[1].region: 'us-west\\t2' contains the control character U+0009",
    ),
    (
        "recursive alias",
        lambda t: t.replace("    gpu_quota: 32\n", "    gpu_quota: 32\n    x: &loop [*loop]\n"),
        "teams[0].x[0]: a YAML alias refers to a value that contains it",
    ),
]


@pytest.mark.parametrize(("edit", "message"), [c[1:] for c in TEXT_CASES], ids=[c[0] for c in TEXT_CASES])
def test_text_case_is_refused_in_one_line(tmp_path: Path, edit: Callable[[str], str], message: str) -> None:
    text = edit(BASE_TEXT)
    assert text != BASE_TEXT, "the edit did not apply"
    path = tmp_path / "teams.yaml"
    path.write_text(text, encoding="utf-8")
    assert message in _rejection(path)


def test_non_utf8_byte_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "teams.yaml"
    path.write_bytes(BASE_TEXT.replace("# Every field", "# caf\xe9 Every field").encode("latin-1"))
    assert _rejection(path) == f"{path}: not UTF-8 text (byte 0xe9 at line 2); save the file as UTF-8"


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    """An edit of teams[i]...: `path` like `0.gpu_node_group.min_nodes`; `...` deletes the key."""

    def apply(data: dict[str, Any]) -> None:
        *parents, last = [int(p) if p.isdigit() else p for p in path.split(".")]
        node: Any = data["teams"]
        for part in parents:
            node = node[part]
        if value is ...:
            del node[last]
        else:
            node[last] = value

    return apply


def _both(*edits: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    def apply(data: dict[str, Any]) -> None:
        for edit in edits:
            edit(data)

    return apply


CHINA = {
    "region": "cn-north-1",
    "network": {"availability_zones": ["cn-north-1a", "cn-north-1b"], "gpu_availability_zone": "cn-north-1a"},
}

# Value cases: the checked-in teams.yaml with one value changed, written back as YAML.
VALUE_CASES: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    (
        "min_nodes true",
        _set("0.gpu_node_group.min_nodes", True),
        "teams[0].gpu_node_group.min_nodes: must be an integer, got true",
    ),
    (
        "max_nodes float",
        _set("0.gpu_node_group.max_nodes", 4.0),
        "teams[0].gpu_node_group.max_nodes: must be an integer, got 4.0",
    ),
    (
        "storage as string",
        _set("0.fsx.storage_gib", "2400"),
        "teams[0].fsx.storage_gib: must be an integer, got '2400'",
    ),
    (
        "deploy_trainer string",
        _set("1.deploy_trainer", "yes"),
        "teams[1].deploy_trainer: must be true or false, got 'yes'",
    ),
    ("name as number", _set("1.name", 7), "teams[1].name: must be a string, got 7"),
    ("network as list", _set("1.network", []), "teams[1].network: must be a mapping, got a list"),
    (
        "start without deploy",
        _both(_set("1.start_trainer", True), _set("1.deploy_trainer", False)),
        "teams[1].start_trainer: true needs deploy_trainer: true (the trainer is not deployed)",
    ),
    (
        "fs path without s3",
        _set("0.fsx.s3_path", ...),
        "teams[0].fsx.s3_file_system_path: has no effect without s3_path (nothing is linked)",
    ),
    (
        "uppercase AZ",
        _set("1.network.availability_zones", ["us-west-2a", "us-west-2B"]),
        "teams[1].network.availability_zones[1]: 'us-west-2B' is not an availability zone of us-west-2",
    ),
    (
        "link-local VPC",
        _set("0.network.vpc_cidr", "169.254.0.0/16"),
        "teams[0].network.vpc_cidr: 169.254.0.0/16 is link-local",
    ),
    (
        "loopback VPC",
        _set("0.network.vpc_cidr", "127.0.0.0/16"),
        "teams[0].network.vpc_cidr: 127.0.0.0/16 is loopback",
    ),
    (
        "multicast VPC",
        _set("0.network.vpc_cidr", "239.1.0.0/16"),
        "teams[0].network.vpc_cidr: 239.1.0.0/16 is multicast",
    ),
    (
        "public VPC",
        _set("0.network.vpc_cidr", "52.0.0.0/16"),
        "teams[0].network.vpc_cidr: 52.0.0.0/16 is public",
    ),
    (
        "bucket ..",
        _set("0.fsx.s3_path", "s3://my..bucket/x"),
        "teams[0].fsx.s3_path: bucket 'my..bucket' must not contain two adjacent periods",
    ),
    (
        "bucket IP",
        _set("0.fsx.s3_path", "s3://10.1.2.3/x"),
        "teams[0].fsx.s3_path: bucket '10.1.2.3' must not be formatted as an IP address",
    ),
    (
        "bucket uppercase",
        _set("0.fsx.s3_path", "s3://MyBucket"),
        "teams[0].fsx.s3_path: bucket 'MyBucket' must be 3 to 63 lowercase",
    ),
    (
        "bucket prefix",
        _set("0.fsx.s3_path", "s3://xn--bucket/x"),
        "bucket 'xn--bucket' must not start with the reserved prefix 'xn--'",
    ),
    (
        "bucket suffix",
        _set("0.fsx.s3_path", "s3://data-s3alias"),
        "bucket 'data-s3alias' must not end with the reserved suffix '-s3alias'",
    ),
    (
        "ARN of another partition",
        _set("0.admin_principal_arns", ["arn:aws-us-gov:iam::111111111111:role/X"]),
        "teams[0].admin_principal_arns[0]: 'arn:aws-us-gov:iam::111111111111:role/X' is in partition "
        "aws-us-gov, but region us-east-2 is in aws",
    ),
    (
        "China team with a commercial ARN",
        lambda d: d["teams"][1].update(copy.deepcopy(CHINA)),
        "teams[1].admin_principal_arns[0]: 'arn:aws:iam::222222222222:role/PlatformAdmin' is in partition "
        "aws, but region cn-north-1 is in aws-cn",
    ),
    (
        "ISO region",
        _set("1.region", "us-iso-east-1"),
        "teams[1].region: us-iso-east-1 is an ISO (air-gapped) region",
    ),
    (
        "57-character name",
        _set("1.name", "t" * 57),
        "teams[1].name: 57 characters is too long: derived names such as the node group '"
        + "t" * 57
        + "-system' (64)",
    ),
    (
        "public CIDR halves",
        _set("1.endpoint_public_cidrs", ["0.0.0.0/1", "128.0.0.0/1"]),
        "teams[1].endpoint_public_cidrs: 0.0.0.0/0 would open the API server to the internet (the union of "
        "0.0.0.0/1, 128.0.0.0/1 covers it)",
    ),
    (
        "public CIDR many pieces",
        _set("1.endpoint_public_cidrs", [f"{i * 32}.0.0.0/3" for i in range(8)]),
        "teams[1].endpoint_public_cidrs: 0.0.0.0/0 would open the API server to the internet",
    ),
    (
        "public CIDR ipv6",
        _set("1.endpoint_public_cidrs", ["::/0"]),
        "teams[1].endpoint_public_cidrs: ::/0 would open the API server",
    ),
    (
        "CIDR host bits",
        _set("1.endpoint_public_cidrs", ["203.0.113.7/24"]),
        "teams[1].endpoint_public_cidrs: '203.0.113.7/24' is not a CIDR block",
    ),
]


@pytest.mark.parametrize(("edit", "message"), [c[1:] for c in VALUE_CASES], ids=[c[0] for c in VALUE_CASES])
def test_value_case_is_refused_in_one_line(
    tmp_path: Path, edit: Callable[[dict[str, Any]], None], message: str
) -> None:
    data = copy.deepcopy(BASE)
    edit(data)
    path = tmp_path / "teams.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    assert message in _rejection(path)


@pytest.mark.parametrize(
    "edit",
    [
        _set("1.name", "t" * 56),
        _set("1.endpoint_public_cidrs", ["0.0.0.0/1", "203.0.113.0/24"]),
        _set("1.endpoint_public_cidrs", ["198.51.100.0/24"]),  # IPv6 is refused (IPv4 cluster)
        _set("0.network.vpc_cidr", "192.168.0.0/16"),
        _set("0.fsx.s3_path", "s3://a.b-c/x/y"),
        lambda d: d["teams"][1].update(
            copy.deepcopy(CHINA), admin_principal_arns=["arn:aws-cn:iam::222222222222:role/PlatformAdmin"]
        ),
    ],
)
def test_boundaries_that_are_valid_still_load(tmp_path: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    data = copy.deepcopy(BASE)
    edit(data)
    path = tmp_path / "teams.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    assert len(load_teams(path)) == 2


def test_yaml_merge_keys_still_override(tmp_path: Path) -> None:
    """`<<:` merges are not duplicate keys: the explicit key wins, as YAML specifies."""
    text = BASE_TEXT.replace(
        "    system_node_group:\n      instance_type: m6i.xlarge\n",
        "    system_node_group:\n      <<: {instance_type: m5.large}\n      instance_type: m6i.xlarge\n",
    )
    assert text != BASE_TEXT
    path = tmp_path / "teams.yaml"
    path.write_text(text, encoding="utf-8")
    assert load_teams(path)[0].system_node_group.instance_type == "m6i.xlarge"


def test_validate_command_exits_2_with_the_error_as_last_line(tmp_path: Path) -> None:
    """`make synth` runs this before the CDK CLI, so the one-line error is what the user sees last."""
    path = tmp_path / "teams.yaml"
    path.write_text(BASE_TEXT.replace("min_nodes: 0", "min_nodes: true"), encoding="utf-8")
    run = subprocess.run(
        [sys.executable, "-m", "infra.teams", str(path)],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        check=False,
    )
    assert run.returncode == 2
    assert run.stderr.splitlines() == [
        "error: teams[0].gpu_node_group.min_nodes: must be an integer, got true (line 17)"
    ]
    ok = subprocess.run(
        [sys.executable, "-m", "infra.teams", str(REPO_ROOT / "teams.yaml")],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        check=False,
    )
    assert ok.returncode == 0, ok.stderr
