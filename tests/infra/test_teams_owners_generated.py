"""Generated teams files per class of the third bad-input sweep, for what spans fields or teams: random
members of each class, refused in one line naming the field as written (and, for a collision, both teams),
or accepted.

Classes here: team names Kubernetes or the blueprint's add-ons own as namespaces; names AWS keeps one of
per account and region (stacks, alarm topics) and S3 export prefixes two teams could share; chart values
the team derives (checked against k8s/values.schema.json, then rendered by helm); AWS limits (EKS public
CIDRs, S3 key bytes, FSx association paths).
"""

from __future__ import annotations

import copy
import json
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
from infra.teams.aws_rules import (
    EXPORT_PATH_ROOM,
    MAX_FSX_FILE_SYSTEM_PATH,
    MAX_PUBLIC_ACCESS_CIDRS,
    MAX_S3_KEY_BYTES,
)
from infra.teams.chart_bounds import chart_bound_problem, chart_property
from tests.chart.helm import template_result
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


# ---- one bound per value, from the layer that consumes it ----------------------------------------------


def _chart_values(team: Any) -> dict[str, Any]:
    """The chart values a validated team derives (what infra/trainer_release.py passes, CDK-free)."""
    from infra.teams.checkpoints import checkpoint_values

    return {
        "nodes": team.gpu_node_group.desired_nodes,
        "spareNodes": team.gpu_node_group.spare_nodes,
        **checkpoint_values(team.checkpoints, team.storage_sizing.write_s),
    }


CHART_MAX = {
    name: chart_property(name)["maximum"] for name in ("ckptInterval", "ckptKeep", "ckptWriteTimeout")
}
cadences = st.one_of(
    st.fixed_dictionaries(
        {"interval_steps": st.one_of(st.integers(1, 10**6), st.integers(10**11, 2**63 - 1))}
    ),
    st.fixed_dictionaries(
        {
            "interval_minutes": st.floats(0.5, 7 * 24 * 60),
            "step_seconds": st.one_of(
                st.floats(1e-300, 1e-3), st.floats(0.01, 3600), st.sampled_from([5e-324, 1e-300, 1e-9])
            ),
        }
    ),
)


@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(cadence=cadences)
def test_what_the_teams_check_passes_the_chart_accepts(cadence: dict[str, Any]) -> None:
    """Checked against the chart's bounds at the teams layer: a cadence is refused there naming the field
    the team wrote, or the chart renders the values derived from it (never refused at deploy)."""
    data = copy.deepcopy(BASE)
    data["teams"][0]["checkpoints"] = cadence
    # no checkpoint-age alarm in reach: only the chart's bounds and the sizing decide here
    data["teams"][0]["observability"] = {"alarms": {"max_checkpoint_age_minutes": 10080}}
    result = outcome(data)
    if isinstance(result, str):
        field = "interval_steps" if "interval_steps" in cadence else "step_seconds"
        assert result.startswith(f"teams[0].checkpoints.{field}: ") or result.startswith(
            "teams[0].checkpoints: "
        ), result
        if "ckptInterval" in result:
            steps = (
                cadence.get("interval_steps") or cadence["interval_minutes"] * 60 / cadence["step_seconds"]
            )
            assert steps > CHART_MAX["ckptInterval"], result
        return
    values = _chart_values(result[0])
    rendered = template_result({**values, "gpusPerNode": 8, "instanceType": "p5.48xlarge"})
    assert rendered.returncode == 0, (values, rendered.stderr)


@pytest.mark.parametrize(
    ("cadence", "field"),
    [
        ({"interval_steps": 9223372036854775807}, "teams[0].checkpoints.interval_steps"),
        ({"interval_steps": CHART_MAX["ckptInterval"] + 1}, "teams[0].checkpoints.interval_steps"),
        # no step is shorter than a millisecond: refused by the field's own bound before any chart value
        ({"step_seconds": 1.0e-300}, "teams[0].checkpoints.step_seconds"),
    ],
)
def test_chart_bound_examples_are_refused_at_the_teams_layer(cadence: dict[str, Any], field: str) -> None:
    data = copy.deepcopy(BASE)
    data["teams"][0]["checkpoints"] = cadence
    result = outcome(data)
    assert isinstance(result, str) and result.startswith(field + ": "), result
    if "interval_steps" in cadence:
        assert "chart's maximum ckptInterval" in result, result


def test_chart_bounds_are_read_from_the_schema_file() -> None:
    """The bound moves with values.schema.json: no copy of it lives in infra."""
    schema = json.loads((REPO_ROOT / "k8s" / "values.schema.json").read_text(encoding="utf-8"))
    assert chart_property("ckptInterval")["maximum"] == schema["properties"]["ckptInterval"]["maximum"]
    assert chart_bound_problem("ckptInterval", schema["properties"]["ckptInterval"]["maximum"]) is None
    assert chart_bound_problem("ckptInterval", schema["properties"]["ckptInterval"]["maximum"] + 1)
    assert chart_bound_problem("preset", "9b") and chart_bound_problem("preset", "8b") is None


@FAST
@given(count=st.integers(1, 60))
def test_public_cidrs_past_the_eks_quota_are_refused(count: int) -> None:
    data = copy.deepcopy(BASE)
    data["teams"][1]["endpoint_public_cidrs"] = [f"203.0.{i // 250}.{i % 250}/32" for i in range(count)]
    result = outcome(data)
    if count > MAX_PUBLIC_ACCESS_CIDRS:
        assert isinstance(result, str) and result.startswith("teams[1].endpoint_public_cidrs: "), result
        assert str(MAX_PUBLIC_ACCESS_CIDRS) in result
    else:
        assert not isinstance(result, str), result


@FAST
@given(
    segment=st.sampled_from(["a", "é", "数"]),  # 1, 2 and 3 bytes in UTF-8
    length=st.integers(200, 400),
    depth=st.integers(1, 4),
)
def test_s3_prefix_past_the_key_limit_is_refused(segment: str, length: int, depth: int) -> None:
    prefix = "/".join([segment * (length // depth)] * depth)
    data = copy.deepcopy(BASE)
    data["teams"][0]["fsx"]["s3_path"] = f"s3://ml-research-checkpoints-111111111111/{prefix}"
    result = outcome(data)
    if len(prefix.encode("utf-8")) > MAX_S3_KEY_BYTES - EXPORT_PATH_ROOM:
        assert isinstance(result, str) and result.startswith("teams[0].fsx.s3_path: "), result
        assert "bytes" in result
    else:
        assert not isinstance(result, str), result


@pytest.mark.parametrize("length", [MAX_FSX_FILE_SYSTEM_PATH - 1, MAX_FSX_FILE_SYSTEM_PATH + 1])
def test_fsx_path_past_the_association_limit_is_refused(length: int) -> None:
    path = "/" + "/".join(["d" * 99] * (length // 100)) + "/" + "e" * (length - 1 - 100 * (length // 100))
    path = path.rstrip("/")[:length]
    data = copy.deepcopy(BASE)
    data["teams"][0]["fsx"]["s3_file_system_path"] = path
    result = outcome(data)
    if len(path) > MAX_FSX_FILE_SYSTEM_PATH:
        assert isinstance(result, str) and result.startswith("teams[0].fsx.s3_file_system_path: "), result
    else:
        assert not isinstance(result, str), result


# ---- settings one of which makes the other dead or unmeetable ------------------------------------------

CHART_LINGER = yaml.safe_load((REPO_ROOT / "k8s" / "values.yaml").read_text(encoding="utf-8"))[
    "metricsLinger"
]


@FAST
@given(scrape=st.integers(10, 300))
def test_scrape_interval_not_shorter_than_the_charts_linger_is_refused_naming_both(scrape: int) -> None:
    data = copy.deepcopy(BASE)
    data["teams"][0]["observability"] = {"scrape_interval_s": scrape}
    result = outcome(data)
    if scrape >= CHART_LINGER:
        assert isinstance(result, str), result
        assert result.startswith("teams[0].observability.scrape_interval_s: ") and "metricsLinger" in result
    else:
        assert not isinstance(result, str), result


@pytest.mark.parametrize("collector", ["cloudwatch", "prometheus"])
@pytest.mark.parametrize("version", [None, "v4.1.0-eksbuild.1"])
def test_addon_version_with_the_prometheus_collector_is_refused_naming_both(
    collector: str, version: str | None
) -> None:
    data = copy.deepcopy(BASE)
    data["teams"][0]["observability"] = _without_none_dict(
        {"collector": collector, "cloudwatch_addon_version": version}
    )
    result = outcome(data)
    if collector == "prometheus" and version:
        assert isinstance(result, str), result
        assert result.startswith("teams[0].observability.cloudwatch_addon_version: ")
        assert "collector: prometheus" in result
    else:
        assert not isinstance(result, str), result


def _without_none_dict(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    cadence=st.one_of(
        st.builds(lambda m: {"interval_minutes": m}, st.floats(5, 300).map(lambda x: round(x, 1))),
        st.builds(lambda n: {"interval_steps": n}, st.integers(100, 9000)),
    ),
    max_age=st.one_of(st.none(), st.integers(10, 400)),
)
def test_checkpoint_interval_the_age_alarm_always_catches_is_refused_naming_both(
    cadence: dict[str, Any], max_age: int | None
) -> None:
    data = copy.deepcopy(BASE)
    data["teams"][0]["checkpoints"] = cadence
    data["teams"][0]["observability"] = {"alarms": {"max_checkpoint_age_minutes": 10080}}
    relaxed = outcome(data)
    if isinstance(relaxed, str):  # the file system cannot carry this cadence at all (sizing's refusal)
        return
    sizing = relaxed[0].storage_sizing
    reached_s = sizing.inputs.interval_s + sizing.write_s  # the newest checkpoint's age before the next
    alarms = {} if max_age is None else {"max_checkpoint_age_minutes": max_age}
    data["teams"][0]["observability"] = {"alarms": alarms}
    limit = 90 if max_age is None else max_age  # the teams file's default
    result = outcome(data)
    if reached_s >= limit * 60:
        assert isinstance(result, str), result
        assert result.startswith(f"teams[0].checkpoints.{next(iter(cadence))}: "), result
        assert "max_checkpoint_age_minutes" in result
    else:
        assert not isinstance(result, str), result
