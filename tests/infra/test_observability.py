"""Observability per team, over the session synth (conftest.py): ml-research keeps the default collector
(CloudWatch), the test team `vision` chooses Prometheus. Plus the teams-file checks of the block and the
agreement of the metric names infra uses with what the trainer's exporter serves and docs/metrics.md."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from aws_cdk.assertions import Match, Template

from infra.config import TeamsConfigError, parse_teams
from infra.dashboards import CLOUDWATCH_EXPORTED, CLOUDWATCH_EXPORTED_BY_TIER, GRAFANA_PANELS, alert_rules
from infra.teams.observability import AlarmThresholds
from tests.helpers import REPO_ROOT
from tests.infra._synth import SynthResult
from tests.infra.helpers import flatten, helm_releases, manifests, resources


def _template(synth: SynthResult, team: str) -> Template:
    assert synth.error is None, f"synth failed: {synth.error}"
    return Template.from_stack(synth.stacks[team])


def test_cloudwatch_default_installs_container_insights_and_the_trainer_scraper(
    synth: SynthResult, templates: dict[str, dict[str, Any]]
) -> None:
    t = _template(synth, "ml-research")
    t.has_resource_properties(
        "AWS::EKS::Addon",
        {
            "AddonName": "amazon-cloudwatch-observability",
            "PodIdentityAssociations": [{"ServiceAccount": "cloudwatch-agent", "RoleArn": Match.any_value()}],
        },
    )
    t.has_resource_properties(
        "AWS::EKS::PodIdentityAssociation",
        {"Namespace": "amazon-cloudwatch", "ServiceAccount": "cwagent-prometheus"},
    )
    objects = manifests(templates["ml-research"])
    (config,) = [
        o
        for o in objects
        if o["kind"] == "ConfigMap" and o["metadata"]["name"] == "cwagent-prometheus-config"
    ]
    agent = json.loads(config["data"]["cwagentconfig.json"])["logs"]["metrics_collected"]["prometheus"]
    assert (
        agent["cluster_name"] == "ml-research"
        and agent["emf_processor"]["metric_namespace"] == "NVRx/Training"
    )
    scrape = json.loads(config["data"]["prometheus.yaml"])["scrape_configs"][0]
    assert scrape["kubernetes_sd_configs"] == [{"role": "pod", "namespaces": {"names": ["ml-research"]}}]
    assert json.loads(config["data"]["prometheus.yaml"])["global"]["scrape_interval"] == "30s"
    (role,) = [o for o in objects if o["kind"] == "Role" and o["metadata"]["name"] == "cwagent-prometheus"]
    assert role["metadata"]["namespace"] == "ml-research"  # pod discovery in the team namespace only
    assert not [o for o in objects if o["kind"] == "ClusterRole"]
    values = helm_releases(templates["ml-research"])["trainer"]["Values"]
    assert values["networkPolicy"] == {"metricsNamespace": "amazon-cloudwatch"}
    assert values["podMonitor"] == {"enabled": False}


def test_cloudwatch_dashboard_and_alarms_route_to_the_team_topic(
    synth: SynthResult, templates: dict[str, dict[str, Any]]
) -> None:
    t = _template(synth, "ml-research")
    t.has_resource_properties(
        "AWS::SNS::Topic", {"TopicName": "ml-research-training-alarms", "KmsMasterKeyId": Match.any_value()}
    )
    alarms = {
        a["Properties"]["AlarmName"]: a["Properties"]
        for a in resources(templates["ml-research"], "AWS::CloudWatch::Alarm")
    }
    assert sorted(alarms) == [
        "ml-research-checkpoint-stale",
        "ml-research-goodput-low",
        "ml-research-no-progress",
    ]
    defaults = AlarmThresholds()
    expected = {
        "ml-research-no-progress": (
            "trainer_seconds_since_last_step",
            "GreaterThanThreshold",
            defaults.no_progress_minutes * 60,
        ),
        "ml-research-goodput-low": (
            "trainer_goodput_last_hour_ratio",
            "LessThanThreshold",
            defaults.min_goodput_last_hour,
        ),
        "ml-research-checkpoint-stale": (
            "trainer_seconds_since_last_checkpoint",
            "GreaterThanThreshold",
            defaults.max_checkpoint_age_minutes * 60,
        ),
    }
    for name, (metric, op, threshold) in expected.items():
        alarm = alarms[name]
        assert (alarm["MetricName"], alarm["ComparisonOperator"], alarm["Threshold"]) == (
            metric,
            op,
            threshold,
        )
        assert alarm["Namespace"] == "NVRx/Training" and alarm["TreatMissingData"] == "notBreaching"
        dims = {d["Name"]: d["Value"] for d in alarm["Dimensions"]}
        assert dims == {"ClusterName": "ml-research", "Namespace": "ml-research"}
        (action,) = alarm["AlarmActions"]
        assert "AlarmTopic" in action["Ref"]
    (dashboard,) = resources(templates["ml-research"], "AWS::CloudWatch::Dashboard")
    body = json.loads(flatten(dashboard["Properties"]["DashboardBody"]))
    titles = [w["properties"]["title"] for w in body["widgets"]]
    for title in ("Goodput", "Steps per minute", "Faults recovered by tier", "Recovery time per fault",
                  "Checkpoint stall per save", "Checkpoint age", "GPU utilisation", "GPU memory",
                  "EFA receive drops", "Nodes"):  # fmt: skip
        assert title in titles
    text = json.dumps(body)
    assert "node_gpu_utilization" in text and "trainer_goodput_ratio" in text


def test_prometheus_collector_installs_the_pinned_stack_with_alerts_to_the_named_topic(
    synth: SynthResult, templates: dict[str, dict[str, Any]]
) -> None:
    template = templates["vision"]
    t = _template(synth, "vision")
    t.has_resource_properties("AWS::SNS::Topic", {"TopicName": "vision-pager"})
    t.has_resource_properties(
        "AWS::SNS::Subscription", {"Protocol": "email", "Endpoint": "oncall@example.com"}
    )
    assert not resources(template, "AWS::CloudWatch::Alarm")  # Alertmanager pages instead
    addons = {a["Properties"]["AddonName"] for a in resources(template, "AWS::EKS::Addon")}
    assert "amazon-cloudwatch-observability" not in addons
    releases = helm_releases(template)
    stack = releases["kube-prometheus-stack"]
    assert stack["Version"] == "87.6.0" and stack["Namespace"] == "monitoring"
    (rules,) = stack["Values"]["additionalPrometheusRulesMap"]["nvrx-training"]["groups"]
    exprs = {r["alert"]: r["expr"] for r in rules["rules"]}
    assert exprs["TrainingNoProgress"] == "max(trainer_seconds_since_last_step) > 1200"
    assert exprs["TrainingGoodputLow"] == "max(trainer_goodput_last_hour_ratio) < 0.7"
    assert exprs["TrainingCheckpointStale"] == "max(trainer_seconds_since_last_checkpoint) > 7200"
    (receiver,) = stack["Values"]["alertmanager"]["config"]["receivers"]
    assert receiver["sns_configs"][0]["topic_arn"].startswith("<")  # the topic's Ref, resolved at deploy
    assert releases["dcgm-exporter"]["Version"] == "4.8.2"
    t.has_resource_properties(
        "AWS::EKS::PodIdentityAssociation", {"Namespace": "monitoring", "ServiceAccount": "alertmanager"}
    )
    (board,) = [
        o
        for o in manifests(template)
        if o["kind"] == "ConfigMap" and "grafana_dashboard" in o["metadata"].get("labels", {})
    ]
    assert len(json.loads(board["data"]["training.json"])["panels"]) == len(GRAFANA_PANELS)
    values = releases["trainer"]["Values"]
    assert values["networkPolicy"] == {"metricsNamespace": "monitoring"}
    assert values["podMonitor"] == {"enabled": True}


@pytest.mark.parametrize(
    ("observability", "field"),
    [
        ({"collector": "datadog"}, "teams[1].observability.collector"),
        ({"alarm_topic_name": "has space"}, "teams[1].observability.alarm_topic_name"),
        ({"alarm_emails": ["not-an-address"]}, "teams[1].observability.alarm_emails[0]"),
        ({"alarms": {"min_goodput_last_hour": 1.5}}, "teams[1].observability.alarms.min_goodput_last_hour"),
        ({"alarms": {"no_progress_minutes": 0}}, "teams[1].observability.alarms.no_progress_minutes"),
        ({"scrape_interval_s": 1}, "teams[1].observability.scrape_interval_s"),
        ({"cloudwatch_addon_version": "latest"}, "teams[1].observability.cloudwatch_addon_version"),
        ({"dashboards": True}, "teams[1].observability.dashboards"),
    ],
)
def test_bad_observability_values_name_the_field(observability: dict[str, Any], field: str) -> None:
    import yaml

    teams = yaml.safe_load((REPO_ROOT / "teams.yaml").read_text())["teams"]
    bad = {**teams[1], "observability": observability}
    with pytest.raises(TeamsConfigError) as err:
        parse_teams({"teams": [teams[0], bad]})
    assert str(err.value).startswith(f"{field}:"), str(err.value)
    assert "\n" not in str(err.value)


def _served_metric_names() -> set[str]:
    """Every sample name the trainer's exporter serves for a run with a fault, a save and an hour of age."""
    from trainer.events.metrics_export import fold_events, fold_families

    def ev(name: str, t: float, rank: int = 0, **fields: Any) -> dict[str, Any]:
        return {"ev": name, "t": t, "rank": rank, "pid": 1, "restart": 0, "iteration": 0, **fields}

    events = [
        ev("run_start", 0.0, world_size=2, config={}),
        ev("step", 2.0, step=0, t_start=1.0, t_end=2.0, loss=1.0, tokens=8),
        ev("ckpt_save", 2.1, step=0, blocked_s=0.1, mode="sync", bytes=1),
        ev("ckpt_commit", 2.2, step=0, path="p", total_s=0.2),
        ev("fault_injected", 2.5, rank=1, fault="exception", step=1),
        ev("fault_detected", 2.6, tier=1, reason="x"),
        ev("restore", 3.0, step=0, path="p", load_s=0.1),
        ev("step", 4.0, step=1, t_start=3.5, t_end=4.0, loss=1.0, tokens=8),
    ]
    names = set()
    for family in fold_families(fold_events(events), now=4000.0):
        names |= {s.name for s in family.samples}
    return names


def test_every_metric_infra_uses_is_served_by_the_trainer_and_documented() -> None:
    served = _served_metric_names()
    used = set(CLOUDWATCH_EXPORTED) | set(CLOUDWATCH_EXPORTED_BY_TIER)
    for rule in alert_rules(AlarmThresholds()):
        used |= set(re.findall(r"trainer_[a-z_]+", rule["expr"]))
    for _, expr, _ in GRAFANA_PANELS:
        used |= set(re.findall(r"trainer_[a-z_]+", expr))
    assert used - served == set()
    documented = Path(REPO_ROOT / "docs" / "metrics.md").read_text()
    families = {re.sub(r"_(bucket|sum|count)$", "", n) for n in served}
    undocumented = {n for n in families if f"`{n}`" not in documented}
    assert undocumented == set()
