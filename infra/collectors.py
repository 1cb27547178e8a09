"""Metric collection in a team cluster, one of two (teams file `observability.collector`, docs/infra.md):

- `cloudwatch` (default): the amazon-cloudwatch-observability EKS add-on (Container Insights with enhanced
  observability: node, pod, NVIDIA GPU and EFA metrics, node conditions) and a CloudWatch agent that
  scrapes the trainer's endpoint in the team namespace and publishes its metrics (EMF) to CloudWatch.
- `prometheus`: kube-prometheus-stack (Prometheus, Alertmanager -> SNS, Grafana, node-exporter,
  kube-state-metrics) and NVIDIA's DCGM exporter, pinned Helm charts; the trainer chart's PodMonitor.

Both take AWS credentials through EKS Pod Identity; the collector's namespace is the one the trainer
chart's NetworkPolicy admits to the metrics port (chart value networkPolicy.metricsNamespace).
"""

from __future__ import annotations

import json
from typing import Any

from aws_cdk import Stack
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_sns as sns
from constructs import Construct

from infra.addons import PinnedChart, pod_identity_role
from infra.dashboards import (
    CLOUDWATCH_EXPORTED,
    CLOUDWATCH_EXPORTED_BY_TIER,
    TRAINER_NAMESPACE,
    alert_rules,
    grafana_dashboard_json,
)
from infra.gpu_nodegroup import GPU_NODE_ROLE, GPU_TAINT_KEY, NODE_ROLE_LABEL
from infra.teams.observability import ObservabilityConfig

CLOUDWATCH_K8S_NAMESPACE = "amazon-cloudwatch"  # created by the add-on
PROMETHEUS_K8S_NAMESPACE = "monitoring"
CLOUDWATCH_AGENT_IMAGE = "public.ecr.aws/cloudwatch-agent/cloudwatch-agent:1.300062.0b1304"
KUBE_PROMETHEUS_STACK = PinnedChart(
    "https://prometheus-community.github.io/helm-charts",
    "kube-prometheus-stack",
    "87.6.0",
    PROMETHEUS_K8S_NAMESPACE,
)
DCGM_EXPORTER = PinnedChart(
    "https://nvidia.github.io/dcgm-exporter/helm-charts", "dcgm-exporter", "4.8.2", PROMETHEUS_K8S_NAMESPACE
)
SCRAPER = "cwagent-prometheus"  # the trainer-scraping CloudWatch agent's name and service account
ALERTMANAGER_SA = "alertmanager"
TRAINER_SCRAPE_JOB = "nvrx-trainer"
_SYSTEM_NODES = {NODE_ROLE_LABEL: "system"}


def trainer_scrape_config(team_namespace: str, interval_s: int) -> dict[str, Any]:
    """Prometheus scrape config of the trainer: pods of the team namespace that carry the chart's
    prometheus.io annotations and the trainer component label, every pod (each serves the port)."""
    return {
        "global": {"scrape_interval": f"{interval_s}s", "scrape_timeout": "10s"},
        "scrape_configs": [
            {
                "job_name": TRAINER_SCRAPE_JOB,
                "kubernetes_sd_configs": [{"role": "pod", "namespaces": {"names": [team_namespace]}}],
                "relabel_configs": [
                    {
                        "source_labels": ["__meta_kubernetes_pod_annotation_prometheus_io_scrape"],
                        "action": "keep",
                        "regex": "true",
                    },
                    {
                        "source_labels": ["__meta_kubernetes_pod_label_app_kubernetes_io_component"],
                        "action": "keep",
                        "regex": "trainer",
                    },
                    {
                        "source_labels": [
                            "__address__",
                            "__meta_kubernetes_pod_annotation_prometheus_io_port",
                        ],
                        "action": "replace",
                        "regex": r"([^:]+)(?::\d+)?;(\d+)",
                        "replacement": "$1:$2",
                        "target_label": "__address__",
                    },
                    {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "Namespace"},
                    {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
                ],
            }
        ],
    }


def cloudwatch_agent_config(cluster_name: str, region: str) -> dict[str, Any]:
    """The scraping agent's config: which trainer metrics become CloudWatch metrics, with which dimensions
    (ClusterName and Namespace; the tier-labelled counters also by tier). No pod dimension: whichever pod
    hosts rank 0 serves the run's series, so one run stays one CloudWatch series across restarts."""
    exact = "|".join(CLOUDWATCH_EXPORTED)
    by_tier = "|".join(CLOUDWATCH_EXPORTED_BY_TIER)
    job = {"source_labels": ["job"], "label_matcher": f"^{TRAINER_SCRAPE_JOB}$"}
    return {
        "agent": {"region": region},
        "logs": {
            "metrics_collected": {
                "prometheus": {
                    "cluster_name": cluster_name,
                    "log_group_name": f"/aws/containerinsights/{cluster_name}/prometheus",
                    "prometheus_config_path": "/etc/prometheusconfig/prometheus.yaml",
                    "emf_processor": {
                        "metric_namespace": TRAINER_NAMESPACE,
                        "metric_declaration": [
                            {
                                **job,
                                "dimensions": [["ClusterName", "Namespace"]],
                                "metric_selectors": [f"^({exact})$"],
                            },
                            {
                                **job,
                                "dimensions": [["ClusterName", "Namespace", "tier"]],
                                "metric_selectors": [f"^({by_tier})$"],
                            },
                        ],
                    },
                }
            },
            "force_flush_interval": 5,
        },
    }


class CloudWatchCollection(Construct):
    """Container Insights add-on and the trainer-scraping CloudWatch agent. Attributes: `addon`, `role`,
    `scraper` (its manifests)."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster: eks.Cluster,
        team_namespace: str,
        config: ObservabilityConfig,
    ) -> None:
        super().__init__(scope, construct_id)
        cluster_name = team_namespace  # the cluster is named after the team (infra/cluster.py)
        self.role = pod_identity_role(
            self, "AgentRole", "CloudWatch agents (EKS Pod Identity): metrics and logs"
        )
        self.role.add_managed_policy(
            iam.ManagedPolicy.from_aws_managed_policy_name("CloudWatchAgentServerPolicy")
        )
        self.addon = eks.CfnAddon(
            self,
            "ObservabilityAddon",
            cluster_name=cluster.cluster_name,
            addon_name="amazon-cloudwatch-observability",
            addon_version=config.cloudwatch_addon_version,
            resolve_conflicts="OVERWRITE",
            pod_identity_associations=[
                eks.CfnAddon.PodIdentityAssociationProperty(
                    role_arn=self.role.role_arn, service_account="cloudwatch-agent"
                )
            ],
        )
        self.association = eks.CfnPodIdentityAssociation(
            self,
            "ScraperIdentity",
            cluster_name=cluster.cluster_name,
            namespace=CLOUDWATCH_K8S_NAMESPACE,
            service_account=SCRAPER,
            role_arn=self.role.role_arn,
        )
        self.association.node.add_dependency(self.addon)
        ns = CLOUDWATCH_K8S_NAMESPACE
        labels = {"app.kubernetes.io/name": SCRAPER}
        self.scraper = cluster.add_manifest(
            "TrainerScraper",
            {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": SCRAPER, "namespace": ns}},
            # Pod discovery in the team namespace only: a Role there, not a ClusterRole.
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "Role",
                "metadata": {"name": SCRAPER, "namespace": team_namespace},
                "rules": [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]}],
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "RoleBinding",
                "metadata": {"name": SCRAPER, "namespace": team_namespace},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": SCRAPER},
                "subjects": [{"kind": "ServiceAccount", "name": SCRAPER, "namespace": ns}],
            },
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": f"{SCRAPER}-config", "namespace": ns},
                "data": {
                    "cwagentconfig.json": json.dumps(
                        cloudwatch_agent_config(cluster_name, Stack.of(self).region)
                    ),
                    "prometheus.yaml": json.dumps(
                        trainer_scrape_config(team_namespace, config.scrape_interval_s)
                    ),
                },
            },
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": SCRAPER, "namespace": ns, "labels": labels},
                "spec": {
                    "replicas": 1,
                    "selector": {"matchLabels": labels},
                    "template": {"metadata": {"labels": labels}, "spec": self._pod_spec()},
                },
            },
        )
        self.scraper.node.add_dependency(self.addon)  # the add-on creates the amazon-cloudwatch namespace

    @staticmethod
    def _pod_spec() -> dict[str, Any]:
        config = f"{SCRAPER}-config"
        return {
            "serviceAccountName": SCRAPER,
            "nodeSelector": _SYSTEM_NODES,
            "containers": [
                {
                    "name": "cloudwatch-agent",
                    "image": CLOUDWATCH_AGENT_IMAGE,
                    "resources": {
                        "requests": {"cpu": "200m", "memory": "200Mi"},
                        "limits": {"cpu": "1", "memory": "1Gi"},
                    },
                    "securityContext": {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}},
                    "volumeMounts": [
                        {"name": "agent", "mountPath": "/etc/cwagentconfig"},
                        {"name": "scrape", "mountPath": "/etc/prometheusconfig"},
                    ],
                }
            ],
            "volumes": [
                {
                    "name": "agent",
                    "configMap": {
                        "name": config,
                        "items": [{"key": "cwagentconfig.json", "path": "cwagentconfig.json"}],
                    },
                },
                {
                    "name": "scrape",
                    "configMap": {
                        "name": config,
                        "items": [{"key": "prometheus.yaml", "path": "prometheus.yaml"}],
                    },
                },
            ],
        }


class PrometheusCollection(Construct):
    """kube-prometheus-stack (alerts to the SNS topic, the team's Grafana dashboard) and the DCGM exporter.
    Attributes: `stack`, `dcgm`, `dashboard` (the Grafana dashboard ConfigMap), `alertmanager_role`."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        cluster: eks.Cluster,
        team_namespace: str,
        config: ObservabilityConfig,
        topic: sns.ITopic,
        topic_key: kms.IKey,
    ) -> None:
        super().__init__(scope, construct_id)
        self.alertmanager_role = pod_identity_role(
            self, "AlertmanagerRole", "Alertmanager (EKS Pod Identity): publish alerts"
        )
        # Exact actions (topic.grant_publish would add kms:GenerateDataKey*): publish to this topic only.
        self.alertmanager_role.add_to_policy(
            iam.PolicyStatement(actions=["sns:Publish"], resources=[topic.topic_arn])
        )
        topic_key.grant(self.alertmanager_role, "kms:Decrypt", "kms:GenerateDataKey")
        region = Stack.of(self).region
        values = {
            "prometheus": {
                "prometheusSpec": {
                    "scrapeInterval": f"{config.scrape_interval_s}s",
                    # Select the trainer chart's PodMonitor and the rules below without Helm release labels.
                    "podMonitorSelectorNilUsesHelmValues": False,
                    "ruleSelectorNilUsesHelmValues": False,
                    "nodeSelector": _SYSTEM_NODES,
                }
            },
            "additionalPrometheusRulesMap": {
                "nvrx-training": {"groups": [{"name": "nvrx-training", "rules": alert_rules(config.alarms)}]}
            },
            "alertmanager": {
                "serviceAccount": {"create": True, "name": ALERTMANAGER_SA},
                "alertmanagerSpec": {"nodeSelector": _SYSTEM_NODES},
                "config": {
                    "route": {"receiver": "sns", "group_by": ["alertname", "namespace"]},
                    "receivers": [
                        {
                            "name": "sns",
                            "sns_configs": [{"topic_arn": topic.topic_arn, "sigv4": {"region": region}}],
                        }
                    ],
                },
            },
            "grafana": {"sidecar": {"dashboards": {"enabled": True, "label": "grafana_dashboard"}}},
        }
        self.stack = self._chart(cluster, "KubePrometheusStack", KUBE_PROMETHEUS_STACK, values)
        self.dcgm = self._chart(
            cluster,
            "DcgmExporter",
            DCGM_EXPORTER,
            {
                "tolerations": [{"key": GPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}],
                "nodeSelector": {NODE_ROLE_LABEL: GPU_NODE_ROLE},
                "serviceMonitor": {"enabled": True},
            },
        )
        self.dcgm.node.add_dependency(self.stack)  # its ServiceMonitor needs the operator's CRDs
        self.identity = eks.CfnPodIdentityAssociation(
            self,
            "AlertmanagerIdentity",
            cluster_name=cluster.cluster_name,
            namespace=PROMETHEUS_K8S_NAMESPACE,
            service_account=ALERTMANAGER_SA,
            role_arn=self.alertmanager_role.role_arn,
        )
        self.dashboard = cluster.add_manifest(
            "GrafanaDashboard",
            {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {
                    "name": f"{team_namespace}-training-dashboard",
                    "namespace": PROMETHEUS_K8S_NAMESPACE,
                    "labels": {"grafana_dashboard": "1"},
                },
                "data": {"training.json": grafana_dashboard_json(team_namespace)},
            },
        )
        self.dashboard.node.add_dependency(self.stack)

    @staticmethod
    def _chart(
        cluster: eks.Cluster, construct_id: str, pinned: PinnedChart, values: dict[str, Any]
    ) -> eks.HelmChart:
        return cluster.add_helm_chart(
            construct_id,
            repository=pinned.repository,
            chart=pinned.chart,
            version=pinned.version,
            namespace=pinned.namespace,
            create_namespace=True,
            release=pinned.chart,
            values=values,
            wait=False,
        )
