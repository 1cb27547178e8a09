"""What a team sees and what pages it: the CloudWatch dashboard and alarms (collector `cloudwatch`), and the
same panels and alerts as a Grafana dashboard and Prometheus rules (collector `prometheus`).

Trainer metric names are the trainer's exporter's (docs/metrics.md; infra does not import the trainer, a
test checks that every name used here is one the exporter serves). Infrastructure metrics: Container
Insights (namespace ContainerInsights, enhanced observability with GPU and EFA) or DCGM, node-exporter
and kube-state-metrics.
"""

from __future__ import annotations

import json
from typing import Any

from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cw
from aws_cdk import aws_cloudwatch_actions as cw_actions
from aws_cdk import aws_sns as sns
from constructs import Construct

from infra.teams.observability import AlarmThresholds

# The CloudWatch namespace the CloudWatch agent publishes the trainer's metrics to (infra/collectors.py).
TRAINER_NAMESPACE = "NVRx/Training"
CONTAINER_INSIGHTS = "ContainerInsights"

# The trainer metrics infra refers to, by purpose (names as the exporter serves them).
GOODPUT = "trainer_goodput_ratio"
GOODPUT_LAST_HOUR = "trainer_goodput_last_hour_ratio"
STEPS = "trainer_steps_total"
SINCE_STEP = "trainer_seconds_since_last_step"
SINCE_CHECKPOINT = "trainer_seconds_since_last_checkpoint"
RECOVERED = "trainer_faults_recovered_total"
RECOVERY = "trainer_recovery_seconds"
STALL = "trainer_checkpoint_stall_seconds"
RECOMPUTED = "trainer_steps_recomputed_total"
DETECTIONS = "trainer_fault_detections_total"
# Gauges and counters the CloudWatch agent turns into CloudWatch metrics (histograms as _sum and _count).
CLOUDWATCH_EXPORTED = (
    GOODPUT,
    GOODPUT_LAST_HOUR,
    STEPS,
    SINCE_STEP,
    SINCE_CHECKPOINT,
    RECOMPUTED,
    f"{RECOVERY}_sum",
    f"{RECOVERY}_count",
    f"{STALL}_sum",
    f"{STALL}_count",
)
CLOUDWATCH_EXPORTED_BY_TIER = (RECOVERED, DETECTIONS)
TIERS = ("1", "2")


def alert_rules(alarms: AlarmThresholds) -> list[dict[str, Any]]:
    """The three alarms as Prometheus alerting rules (the `prometheus` collector)."""
    return [
        {
            "alert": "TrainingNoProgress",
            "expr": f"max({SINCE_STEP}) > {alarms.no_progress_minutes * 60}",
            "labels": {"severity": "critical"},
            "annotations": {"summary": f"No training step ended for {alarms.no_progress_minutes} minutes"},
        },
        {
            "alert": "TrainingGoodputLow",
            "expr": f"max({GOODPUT_LAST_HOUR}) < {alarms.min_goodput_last_hour}",
            "for": "5m",
            "labels": {"severity": "warning"},
            "annotations": {"summary": f"Goodput of the last hour below {alarms.min_goodput_last_hour:.0%}"},
        },
        {
            "alert": "TrainingCheckpointStale",
            "expr": f"max({SINCE_CHECKPOINT}) > {alarms.max_checkpoint_age_minutes * 60}",
            "labels": {"severity": "critical"},
            "annotations": {
                "summary": f"No durable checkpoint for {alarms.max_checkpoint_age_minutes} minutes"
            },
        },
    ]


# Grafana panels: (title, PromQL, unit). DCGM, node-exporter (EFA devices are InfiniBand devices to it)
# and kube-state-metrics come with the `prometheus` collector.
GRAFANA_PANELS: tuple[tuple[str, str, str], ...] = (
    ("Goodput (since start, last hour)", f"max({GOODPUT}) or max({GOODPUT_LAST_HOUR})", "percentunit"),
    ("Steps per second", f"sum(rate({STEPS}[5m]))", "short"),
    ("Faults recovered by tier", f"sum by (tier) (increase({RECOVERED}[1h]))", "short"),
    ("Recovery time by tier (p50)", f"histogram_quantile(0.5, sum by (tier, le) ({RECOVERY}_bucket))", "s"),
    ("Checkpoint stall per save (mean)", f"sum(rate({STALL}_sum[1h])) / sum(rate({STALL}_count[1h]))", "s"),
    ("Checkpoint age", f"max({SINCE_CHECKPOINT})", "s"),
    ("Steps recomputed", f"max({RECOMPUTED})", "short"),
    ("GPU utilisation", "avg by (Hostname) (DCGM_FI_DEV_GPU_UTIL)", "percent"),
    ("GPU memory used", "sum by (Hostname) (DCGM_FI_DEV_FB_USED) * 1024 * 1024", "bytes"),
    ("EFA receive errors", "sum by (instance) (rate(node_infiniband_port_receive_errors_total[5m]))", ""),
    ("Nodes not ready", 'sum(kube_node_status_condition{condition="Ready",status!="true"})', "short"),
)


def grafana_dashboard(team: str) -> dict[str, Any]:
    """A Grafana dashboard (JSON model) of GRAFANA_PANELS, two panels per row."""
    panels = []
    for i, (title, expr, unit) in enumerate(GRAFANA_PANELS):
        panels.append(
            {
                "id": i + 1,
                "type": "timeseries",
                "title": title,
                "gridPos": {"x": 12 * (i % 2), "y": 8 * (i // 2), "w": 12, "h": 8},
                "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
                "targets": [{"expr": expr, "refId": "A"}],
            }
        )
    return {
        "title": f"Training: {team}",
        "uid": f"nvrx-{team}"[:40],
        "schemaVersion": 39,
        "time": {"from": "now-6h", "to": "now"},
        "panels": panels,
    }


def grafana_dashboard_json(team: str) -> str:
    return json.dumps(grafana_dashboard(team), sort_keys=True)


class TrainingDashboard(Construct):
    """The team's CloudWatch dashboard and alarms (collector `cloudwatch`).

    Attributes: `dashboard`, `alarms` (by name: no_progress, goodput_low, checkpoint_stale).
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster_name: str,
        namespace: str,
        thresholds: AlarmThresholds,
        topic: sns.ITopic,
    ) -> None:
        super().__init__(scope, construct_id)
        dims = {"ClusterName": cluster_name, "Namespace": namespace}

        def trainer(name: str, stat: str = "Maximum", tier: str | None = None) -> cw.Metric:
            return cw.Metric(
                namespace=TRAINER_NAMESPACE,
                metric_name=name,
                dimensions_map={**dims, "tier": tier} if tier else dims,
                statistic=stat,
                period=Duration.minutes(1),
                label=f"tier {tier}" if tier else None,  # a label would turn alarms into metric math
            )

        def insights(name: str, stat: str = "Average") -> cw.Metric:
            return cw.Metric(
                namespace=CONTAINER_INSIGHTS,
                metric_name=name,
                dimensions_map={"ClusterName": cluster_name},
                statistic=stat,
                period=Duration.minutes(1),
            )

        def ratio(total: str, count: str, label: str) -> cw.MathExpression:
            return cw.MathExpression(
                expression="s / c",
                using_metrics={"s": trainer(total, "Sum"), "c": trainer(count, "Sum")},
                label=label,
                period=Duration.minutes(5),
            )

        def graph(title: str, metrics: list[cw.IMetric], unit: str = "") -> cw.GraphWidget:
            axis = cw.YAxisProps(label=unit)
            return cw.GraphWidget(title=title, left=metrics, width=8, height=6, left_y_axis=axis)

        self.dashboard = cw.Dashboard(self, "Dashboard", dashboard_name=f"{namespace}-training")
        self.dashboard.add_widgets(
            graph("Goodput", [trainer(GOODPUT), trainer(GOODPUT_LAST_HOUR)], "ratio"),
            graph("Steps per minute", [trainer(STEPS, "Sum")], "steps"),
            graph("Faults recovered by tier", [trainer(RECOVERED, "Sum", t) for t in TIERS], "faults"),
        )
        self.dashboard.add_widgets(
            graph("Recovery time per fault", [ratio(f"{RECOVERY}_sum", f"{RECOVERY}_count", "mean")], "s"),
            graph("Checkpoint stall per save", [ratio(f"{STALL}_sum", f"{STALL}_count", "mean")], "s"),
            graph("Checkpoint age", [trainer(SINCE_CHECKPOINT)], "s"),
        )
        self.dashboard.add_widgets(
            graph("GPU utilisation", [insights("node_gpu_utilization")], "%"),
            graph("GPU memory", [insights("node_gpu_memory_utilization")], "%"),
            graph("EFA receive drops", [insights("node_efa_rx_dropped", "Sum")], "packets"),
        )
        self.dashboard.add_widgets(
            graph("Nodes", [insights("cluster_node_count"), insights("cluster_failed_node_count")], "nodes"),
            graph("Steps recomputed", [trainer(RECOMPUTED)], "steps"),
            graph("Time since the last step", [trainer(SINCE_STEP)], "s"),
        )

        # Missing data is "not breaching": a finished or suspended run exports no age (and no trainer pod
        # exports anything between runs). A run that dies for good fails its Job, which Kubernetes reports.
        def alarm(
            construct_id: str, metric: cw.Metric, threshold: float, op: cw.ComparisonOperator, text: str
        ) -> cw.Alarm:
            created = cw.Alarm(
                self,
                construct_id,
                alarm_name=f"{namespace}-{construct_id}",
                alarm_description=text,
                metric=metric,
                threshold=threshold,
                comparison_operator=op,
                evaluation_periods=1,
                treat_missing_data=cw.TreatMissingData.NOT_BREACHING,
            )
            created.add_alarm_action(cw_actions.SnsAction(topic))
            return created

        above = cw.ComparisonOperator.GREATER_THAN_THRESHOLD
        self.alarms = {
            "no_progress": alarm(
                "no-progress",
                trainer(SINCE_STEP),
                thresholds.no_progress_minutes * 60,
                above,
                f"No training step ended for {thresholds.no_progress_minutes} minutes",
            ),
            "goodput_low": alarm(
                "goodput-low",
                trainer(GOODPUT_LAST_HOUR, "Average").with_(period=Duration.minutes(5)),
                thresholds.min_goodput_last_hour,
                cw.ComparisonOperator.LESS_THAN_THRESHOLD,
                f"Goodput of the last hour below {thresholds.min_goodput_last_hour:.0%}",
            ),
            "checkpoint_stale": alarm(
                "checkpoint-stale",
                trainer(SINCE_CHECKPOINT),
                thresholds.max_checkpoint_age_minutes * 60,
                above,
                f"No durable checkpoint for {thresholds.max_checkpoint_age_minutes} minutes",
            ),
        }
