# ruff: noqa: RUF001  (the point: characters that look like ASCII and are not)
"""Generated teams-file inputs per class of bad input (infra/inputs.py): random members, not only the
examples. The rule: refused in one line naming the field (or the file and line), or accepted and
delivered exactly as written.

Classes: digits and names that are not ASCII, region typos, CIDRs in forms CDK reads differently or in the
wrong family, S3 paths with `.`/`..`/empty segments, YAML alias bombs, huge integers, and teams files that
are not regular files (FIFO, device, symlink loop, directory).
"""

from __future__ import annotations

import copy
import ipaddress
import os
import re
import string
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infra.config import TeamsConfigError, load_teams, parse_teams
from infra.inputs import ALIAS_EXPANSION_BUDGET, MAX_TEAMS_FILE_BYTES, PARTITION_OF_REGION
from tests.helpers import REPO_ROOT

BASE_TEXT = (REPO_ROOT / "teams.yaml").read_text(encoding="utf-8")
BASE = yaml.safe_load(BASE_TEXT)
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
FILES = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
# Where a one-line error may point: `teams[i].field...`, a top-level key, or the file itself.
ONE_LINE = re.compile(r"^(teams(\[\d+\])?(\.[\w\[\]]+)*|[a-z_0-9]+|/\S+|teams file): \S[^\n]*$")


def outcome(data: dict[str, Any]) -> str | list[Any]:
    try:
        return parse_teams(data)
    except TeamsConfigError as exc:
        assert ONE_LINE.match(str(exc)), str(exc)
        return str(exc)


def with_team0(**fields: Any) -> dict[str, Any]:
    data = copy.deepcopy(BASE)
    data["teams"][0].update(fields)
    return data


# Unicode decimal digits of several scripts (Arabic-Indic, Devanagari, fullwidth, ...) and ASCII ones.
unicode_digits = st.characters(categories=["Nd"])


@FAST
@given(digits=st.lists(st.one_of(unicode_digits, st.sampled_from("0123456789")), min_size=12, max_size=12))
def test_account_id_accepted_only_in_ascii_digits(digits: list[str]) -> None:
    account = "".join(digits)
    arn = f"arn:aws:iam::{account}:role/MlResearchAdmin"
    result = outcome(with_team0(account=account, admin_principal_arns=[arn]))
    if account.isascii():
        assert not isinstance(result, str), result
        assert result[0].account == account and result[0].admin_principal_arns == [arn]
    else:
        assert isinstance(result, str) and result.startswith("teams[0].account: "), result


@FAST
@given(
    name=st.text(
        alphabet=string.ascii_letters + string.digits + "+=,.@_-" + "аеорсхАВЕКМНО", min_size=1, max_size=40
    )
)
def test_iam_role_names_accepted_only_in_ascii(name: str) -> None:
    arn = f"arn:aws:iam::111111111111:role/{name}"
    result = outcome(with_team0(admin_principal_arns=[arn]))
    if name.isascii():
        assert not isinstance(result, str), result
        assert result[0].admin_principal_arns == [arn]
    else:
        assert isinstance(result, str) and result.startswith("teams[0].admin_principal_arns[0]: "), result


@FAST
@given(
    region=st.one_of(
        st.sampled_from(sorted(PARTITION_OF_REGION)),
        st.from_regex(r"[a-z]{2}-(east|west|north|south|central|esat|wset|northeast)-[0-9]", fullmatch=True),
        st.from_regex(r"[a-z]{2}-[a-z]{3,9}-[0-9٠-٩０-９]", fullmatch=True),
    )
)
def test_region_accepted_only_when_known(region: str) -> None:
    zones = [f"{region}a", f"{region}b"]
    partition = PARTITION_OF_REGION.get(region, "aws")
    data = with_team0(
        region=region,
        network={"vpc_cidr": "10.0.0.0/16", "availability_zones": zones, "gpu_availability_zone": zones[0]},
        admin_principal_arns=[f"arn:{partition}:iam::111111111111:role/Admin"],
    )
    del data["teams"][0]["fsx"]["s3_path"], data["teams"][0]["fsx"]["s3_file_system_path"]
    result = outcome(data)
    if region in PARTITION_OF_REGION:
        assert not isinstance(result, str), result
        assert result[0].region == region
    else:
        assert isinstance(result, str) and result.startswith("teams[0].region: "), result


def _cidr_forms(net: ipaddress.IPv4Network) -> list[str]:
    """The canonical form and the forms that mean the same block to one parser and not to another."""
    return [
        str(net),
        f"{net.network_address}/{net.netmask}",  # netmask form
        f"{net.network_address}/{net.hostmask}",  # hostmask form
        f"{net.network_address}/0{net.prefixlen}",  # a leading zero in the prefix length
        f"{net.network_address}/{net.prefixlen} ",
    ]


private_16 = st.one_of(
    st.integers(0, 255).map(lambda b: ipaddress.IPv4Network(f"10.{b}.0.0/16")),
    st.integers(16, 31).map(lambda b: ipaddress.IPv4Network(f"172.{b}.0.0/16")),
    st.just(ipaddress.IPv4Network("192.168.0.0/16")),
)


@FAST
@given(net=private_16, form=st.integers(0, 4))
def test_vpc_cidr_accepted_only_in_canonical_form(net: ipaddress.IPv4Network, form: int) -> None:
    cidr = _cidr_forms(net)[form]
    data = with_team0()
    data["teams"][0]["network"]["vpc_cidr"] = cidr
    data["teams"][1]["network"]["vpc_cidr"] = (
        "10.1.0.0/16" if net != ipaddress.IPv4Network("10.1.0.0/16") else "10.2.0.0/16"
    )
    result = outcome(data)
    if cidr == str(net):
        assert not isinstance(result, str), result
        assert result[0].network.vpc_cidr == cidr
    else:
        assert isinstance(result, str) and result.startswith("teams[0].network.vpc_cidr: "), result


public_nets = st.builds(
    lambda addr, length: ipaddress.IPv4Network(f"{ipaddress.IPv4Address(addr)}/{length}", strict=False),
    st.integers(0, 2**32 - 1),
    st.integers(8, 32),
)
ipv6_nets = st.builds(
    lambda addr, length: ipaddress.IPv6Network(f"{ipaddress.IPv6Address(addr)}/{length}", strict=False),
    st.integers(0, 2**128 - 1),
    st.integers(16, 128),
)


@FAST
@given(net=st.one_of(public_nets, ipv6_nets), form=st.integers(0, 3))
def test_public_cidrs_accepted_only_as_canonical_ipv4(net: Any, form: int) -> None:
    cidr = str(net) if net.version == 6 else _cidr_forms(net)[form]
    result = outcome(with_team0(endpoint_access="public_and_private", endpoint_public_cidrs=[cidr]))
    if net.version == 4 and cidr == str(net):
        assert not isinstance(result, str), result
        assert result[0].endpoint_public_cidrs == [cidr]
    else:
        assert isinstance(result, str) and result.startswith("teams[0].endpoint_public_cidrs: "), result


def test_accepted_cidrs_are_accepted_by_cdk_too() -> None:
    """What this check accepts CDK's own parser reads as the same block (the next layer agrees)."""
    from aws_cdk import aws_ec2 as ec2

    for cidr in ("10.0.0.0/16", "172.31.0.0/16", "192.168.0.0/16", "203.0.113.0/24", "198.51.100.7/32"):
        assert not isinstance(
            outcome(with_team0(endpoint_access="public_and_private", endpoint_public_cidrs=[cidr])), str
        )
        ec2.IpAddresses.cidr(cidr)  # raises on what CDK cannot parse


segment = st.one_of(
    st.sampled_from(["", ".", ".."]), st.from_regex(r"[a-z0-9][a-z0-9._-]{0,8}", fullmatch=True)
)


@FAST
@given(segments=st.lists(segment, min_size=1, max_size=5), trailing=st.booleans())
def test_s3_paths_with_dot_or_empty_segments_refused(segments: list[str], trailing: bool) -> None:
    tail = "/".join(segments) + ("/" if trailing else "")
    fs_path, s3_path = "/" + tail, "s3://ml-research-checkpoints-111111111111/" + tail
    # One trailing / is allowed (an empty last segment when not followed by another /).
    bad = any(s in (".", "..") for s in segments) or "" in segments[:-1] or (segments[-1] == "" and trailing)
    data = with_team0()
    data["teams"][0]["fsx"].update(s3_path=s3_path, s3_file_system_path=fs_path)
    result = outcome(data)
    if bad:
        assert isinstance(result, str) and result.startswith("teams[0].fsx.s3_"), result
    else:
        assert not isinstance(result, str), result
        assert (result[0].fsx.s3_path, result[0].fsx.s3_file_system_path) == (s3_path, fs_path)


# ---- the file ------------------------------------------------------------------------------------------


def file_outcome(path: Path) -> str | list[Any]:
    try:
        return load_teams(path)
    except TeamsConfigError as exc:
        assert ONE_LINE.match(str(exc)), str(exc)
        return str(exc)


def _bomb(depth: int, width: int) -> str:
    """Anchors a0..a(depth-1), each a list of `width` aliases of the previous: width**depth values."""
    lines = ["x0: &a0 [v]"]
    for i in range(1, depth):
        lines.append(f"x{i}: &a{i} [{', '.join([f'*a{i - 1}'] * width)}]")
    return "\n".join(lines) + "\n"


@FILES
@given(depth=st.integers(2, 12), width=st.integers(2, 9))
def test_alias_bomb_refused_at_its_line_in_bounded_time(tmp_path_factory, depth: int, width: int) -> None:
    path = tmp_path_factory.mktemp("bomb") / "teams.yaml"
    path.write_text(_bomb(depth, width) + BASE_TEXT, encoding="utf-8")
    start = time.monotonic()
    result = file_outcome(path)
    assert time.monotonic() - start < 5
    # Nodes the aliases stand for: a0 is a list of one scalar (2 nodes); a(i) is a list of `width` a(i-1).
    size, expanded = 2, 0
    for _ in range(1, depth):
        expanded += width * size
        size = 1 + width * size
    if expanded > ALIAS_EXPANSION_BUDGET:
        assert isinstance(result, str) and re.search(r": line \d+: its aliases expand", result), result
    else:  # small aliasing is fine; the unknown top-level keys are what is refused
        assert isinstance(result, str) and "unknown key" in result, result


@FILES
@given(
    digits=st.integers(20, 6000),
    field=st.sampled_from(["gpu_quota", "max_nodes"]),
    sign=st.sampled_from(["", "-"]),
)
def test_huge_integer_is_one_line(tmp_path_factory, digits: int, field: str, sign: str) -> None:
    path = tmp_path_factory.mktemp("int") / "teams.yaml"
    number = sign + "9" * digits
    text = (
        BASE_TEXT.replace("    gpu_quota: 32", f"    gpu_quota: {number}")
        if field == "gpu_quota"
        else BASE_TEXT.replace(
            "      max_nodes: 4\n      capacity", f"      max_nodes: {number}\n      capacity", 1
        )
    )
    assert text != BASE_TEXT
    path.write_text(text, encoding="utf-8")
    result = file_outcome(path)
    assert isinstance(result, str), result


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "loop", "directory", "too-big"])
def test_teams_file_that_is_not_a_small_regular_file(tmp_path: Path, alarm: None, kind: str) -> None:
    path = tmp_path / "teams.yaml"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "loop":
        (tmp_path / "b").symlink_to(path)
        path.symlink_to(tmp_path / "b")
    elif kind == "directory":
        path.mkdir()
    else:
        path.write_text(BASE_TEXT + "#" * MAX_TEAMS_FILE_BYTES, encoding="utf-8")
    result = file_outcome(path)
    assert isinstance(result, str) and result.startswith(f"{path}: "), result


def test_issue_examples(tmp_path: Path) -> None:
    """The hand-written examples, each refused in one line naming the field."""
    cases = {
        "account": (dict(account="١١١١١١١١١١١١"), "teams[0].account: "),
        "region": (dict(region="us-esat-2"), "teams[0].region: "),
        "netmask": (
            dict(endpoint_access="public_and_private", endpoint_public_cidrs=["203.0.113.0/255.255.255.0"]),
            "teams[0].endpoint_public_cidrs: ",
        ),
        "ipv6": (
            dict(endpoint_access="public_and_private", endpoint_public_cidrs=["2001:db8::/32"]),
            "teams[0].endpoint_public_cidrs: ",
        ),
        "arn": (
            dict(admin_principal_arns=["arn:aws:iam::111111111111:role/Аdmin"]),
            "teams[0].admin_principal_arns[0]: ",
        ),
        "addon": (
            dict(observability={"cloudwatch_addon_version": "v١.2.3-eksbuild.1"}),
            "teams[0].observability.cloudwatch_addon_version: ",
        ),
    }
    for name, (fields, prefix) in cases.items():
        result = outcome(with_team0(**fields))
        assert isinstance(result, str) and result.startswith(prefix), (name, result)
    data = with_team0()
    data["teams"][0]["fsx"]["s3_file_system_path"] = "/export/../etc"
    assert str(outcome(data)).startswith("teams[0].fsx.s3_file_system_path: ")
