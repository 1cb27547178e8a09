"""A team's observability: the alarm topic, metric collection (infra/collectors.py) and, with CloudWatch,
the dashboard and alarms (infra/dashboards.py). The teams file's `observability:` block chooses."""

from __future__ import annotations

from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_sns as sns
from constructs import Construct

from infra.collectors import (
    CLOUDWATCH_K8S_NAMESPACE,
    PROMETHEUS_K8S_NAMESPACE,
    CloudWatchCollection,
    PrometheusCollection,
)
from infra.dashboards import TrainingDashboard
from infra.teams.observability import ObservabilityConfig
from infra.teams.observability import alarm_topic_name as alarm_topic_name


def trainer_metrics_values(config: ObservabilityConfig) -> dict[str, object]:
    """The trainer chart values that connect it to the collector (Contract 1 of docs/design.md)."""
    # The chart's NetworkPolicy admits networkPolicy.metricsNamespace to the metrics port (Helm merges the
    # map: the policy's other keys keep their defaults).
    prometheus = config.collector == "prometheus"
    namespace = PROMETHEUS_K8S_NAMESPACE if prometheus else CLOUDWATCH_K8S_NAMESPACE
    return {"networkPolicy": {"metricsNamespace": namespace}, "podMonitor": {"enabled": prometheus}}


class Observability(Construct):
    """Attributes: `topic` (SNS, KMS-encrypted), `key`, `collection` (CloudWatchCollection or
    PrometheusCollection), `dashboard` (TrainingDashboard, cloudwatch only, else None)."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        team_name: str,
        config: ObservabilityConfig,
        cluster: eks.Cluster,
    ) -> None:
        super().__init__(scope, construct_id)
        # A customer-managed key: CloudWatch alarms cannot publish to a topic under the AWS-managed SNS key
        # (its policy cannot grant cloudwatch.amazonaws.com).
        self.key = kms.Key(
            self,
            "AlarmTopicKey",
            description=f"Training alarms of team {team_name}",
            enable_key_rotation=True,
        )
        self.key.grant(
            iam.ServicePrincipal("cloudwatch.amazonaws.com"), "kms:Decrypt", "kms:GenerateDataKey*"
        )
        self.topic = sns.Topic(
            self,
            "AlarmTopic",
            topic_name=alarm_topic_name(team_name, config),
            display_name=f"Training alarms: {team_name}",
            master_key=self.key,
            enforce_ssl=True,
        )
        for i, email in enumerate(config.alarm_emails):
            sns.Subscription(
                self, f"Email{i}", topic=self.topic, endpoint=email, protocol=sns.SubscriptionProtocol.EMAIL
            )

        self.dashboard: TrainingDashboard | None = None
        self.collection: CloudWatchCollection | PrometheusCollection
        if config.collector == "cloudwatch":
            self.collection = CloudWatchCollection(
                self, "CloudWatch", cluster=cluster, team_namespace=team_name, config=config
            )
            self.dashboard = TrainingDashboard(
                self,
                "Dashboard",
                cluster_name=team_name,
                namespace=team_name,
                thresholds=config.alarms,
                topic=self.topic,
            )
        else:
            self.collection = PrometheusCollection(
                self,
                "Prometheus",
                cluster=cluster,
                team_namespace=team_name,
                config=config,
                topic=self.topic,
                topic_key=self.key,
            )
