"""Generated teams files per class of the third bad-input sweep, for what spans fields or teams: random
members of each class, refused in one line naming the field as written (and, for a collision, both teams),
or accepted.

Classes here: team names Kubernetes or the blueprint's add-ons own as namespaces; names AWS keeps one of
per account and region (stacks, alarm topics) and S3 export prefixes two teams could share.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import infra.addons
import infra.collectors
from infra.addons import PinnedChart
from infra.config import TeamsConfigError, parse_teams
from infra.namespaces import ADDON_NAMESPACES, KUBERNETES_NAMESPACES
from tests.helpers import REPO_ROOT

BASE = yaml.safe_load((REPO_ROOT / "teams.yaml").read_text(encoding="utf-8"))
FAST = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
ONE_LINE = re.compile(r"^teams\[\d+\](\.[\w\[\]]+)*: \S[^\n]*$")


def outcome(data: dict[str, Any]) -> str | list[Any]:
    try:
        return parse_teams(data)
    except TeamsConfigError as exc:
        assert ONE_LINE.match(str(exc)), str(exc)
        return str(exc)


def two_teams_in_one_account() -> dict[str, Any]:
    """teams[0] as shipped and a second team in its account and region (no S3 link)."""
    data = copy.deepcopy(BASE)
    second = copy.deepcopy(data["teams"][0])
    second["name"] = "vision"
    second["network"]["vpc_cidr"] = "10.7.0.0/16"
    del second["fsx"]["s3_path"], second["fsx"]["s3_file_system_path"]
    data["teams"][1] = second
    return data


# ---- namespaces ----------------------------------------------------------------------------------------


def _pinned_chart_namespaces() -> set[str]:
    """Every namespace a pinned add-on chart of infra installs into (read from the modules)."""
    found = set()
    for module in (infra.addons, infra.collectors):
        found |= {v.namespace for v in vars(module).values() if isinstance(v, PinnedChart)}
    assert found, "no pinned charts found"
    return found


def test_every_addon_namespace_is_refused_as_a_team_name() -> None:
    owned = _pinned_chart_namespaces() | set(ADDON_NAMESPACES) | set(KUBERNETES_NAMESPACES)
    for name in sorted(owned):
        data = copy.deepcopy(BASE)
        data["teams"][0]["name"] = name
        result = outcome(data)
        assert isinstance(result, str) and result.startswith("teams[0].name: "), (name, result)
        assert "namespace" in result


@FAST
@given(
    name=st.one_of(
        st.sampled_from(sorted(KUBERNETES_NAMESPACES + ADDON_NAMESPACES)),
        st.from_regex(r"kube-[a-z][a-z0-9]{0,20}", fullmatch=True),
        st.from_regex(r"[a-jl-z][a-z0-9]{1,20}(-[a-z0-9]{1,8})?", fullmatch=True),
    )
)
def test_team_name_refused_exactly_when_a_namespace_owner_has_it(name: str) -> None:
    data = copy.deepcopy(BASE)
    data["teams"][0]["name"] = name
    result = outcome(data)
    owned = name in KUBERNETES_NAMESPACES or name in ADDON_NAMESPACES or name.startswith("kube-")
    if owned:
        assert isinstance(result, str) and result.startswith("teams[0].name: "), result
    else:
        assert not isinstance(result, str), result
        assert result[0].name == name


# ---- names shared across teams -------------------------------------------------------------------------

topic_names = st.from_regex(r"[A-Za-z0-9_-]{1,40}", fullmatch=True)


@FAST
@given(
    first=st.one_of(st.none(), topic_names),
    second=st.one_of(st.none(), topic_names, st.just("<first's>")),
    same_region=st.booleans(),
)
def test_alarm_topic_two_teams_would_share_is_refused_naming_both(
    first: str | None, second: str | None, same_region: bool
) -> None:
    data = two_teams_in_one_account()
    a, b = data["teams"]
    default_a = f"{a['name']}-training-alarms"
    if second == "<first's>":
        second = first or default_a
    for team, name in ((a, first), (b, second)):
        if name is not None:
            team["observability"] = {"alarm_topic_name": name}
    if not same_region:
        b["region"] = "us-west-2"
        b["network"]["availability_zones"] = ["us-west-2a", "us-west-2b"]
        b["network"]["gpu_availability_zone"] = "us-west-2a"
    topic_a = first or default_a
    topic_b = second or f"{b['name']}-training-alarms"
    result = outcome(data)
    if same_region and topic_a == topic_b:
        assert isinstance(result, str), result
        assert result.startswith("teams[1].observability.alarm_topic_name: "), result
        assert "team ml-research" in result and "team vision" in result, result
    else:
        assert not isinstance(result, str), result


segments = st.lists(st.from_regex(r"[a-z0-9]{1,6}", fullmatch=True), min_size=0, max_size=3)


@FAST
@given(base=segments, extra_a=segments, extra_b=segments, same_bucket=st.booleans(), slash=st.booleans())
def test_s3_export_prefixes_that_nest_are_refused_naming_both_teams(
    base: list[str], extra_a: list[str], extra_b: list[str], same_bucket: bool, slash: bool
) -> None:
    data = copy.deepcopy(BASE)
    bucket_a = "shared-exports-111111111111"
    bucket_b = bucket_a if same_bucket else "other-exports-222222222222"
    path_a = "/".join([f"s3://{bucket_a}", *base, *extra_a])
    path_b = "/".join([f"s3://{bucket_b}", *base, *extra_b]) + ("/" if slash and (base or extra_b) else "")
    data["teams"][0]["fsx"]["s3_path"] = path_a
    data["teams"][1]["fsx"]["s3_path"] = path_b
    parts_a, parts_b = [*base, *extra_a], [*base, *extra_b]
    shorter = min(len(parts_a), len(parts_b))
    nested = same_bucket and parts_a[:shorter] == parts_b[:shorter]
    result = outcome(data)
    if nested:
        assert isinstance(result, str) and result.startswith("teams[1].fsx.s3_path: "), result
        assert "team ml-research" in result and "overlaps" in result, result
    else:
        assert not isinstance(result, str), result


@pytest.mark.parametrize(
    ("edit", "field"),
    [
        (lambda d: d["teams"][0].update(name="default"), "teams[0].name"),
        (lambda d: d["teams"][1].update(name="monitoring"), "teams[1].name"),
        (lambda d: d["teams"][0].update(name="amazon-cloudwatch"), "teams[0].name"),
        (lambda d: d["teams"][0].update(name="kube-node-lease"), "teams[0].name"),
    ],
)
def test_issue_examples(edit: Any, field: str) -> None:
    data = copy.deepcopy(BASE)
    edit(data)
    result = outcome(data)
    assert isinstance(result, str) and result.startswith(field + ": "), result
