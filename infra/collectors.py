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
from infra.namespaces import CLOUDWATCH_K8S_NAMESPACE, PROMETHEUS_K8S_NAMESPACE
from infra.teams.observability import ObservabilityConfig
from infra.workload_security import container_security_context, pod_security_context

CLOUDWATCH_AGENT_IMAGE = "public.ecr.aws/cloudwatch-agent/cloudwatch-agent:1.300062.0b1304"
CLOUDWATCH_AGENT_HOME = "/opt/aws/amazon-cloudwatch-agent"
TRAINER_METRICS_PORT = 9400  # the chart's metricsPort default (k8s/values.yaml; a test keeps them equal)
# The EKS Pod Identity agent serves credentials on this link-local address of every node.
POD_IDENTITY_EGRESS = {
    "to": [{"ipBlock": {"cidr": "169.254.170.23/32"}}],
    "ports": [{"protocol": "TCP", "port": 80}],
}
DNS_EGRESS = {
    "to": [
        {
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
            "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}},
        }
    ],
    "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}],
}
KUBE_PROMETHEUS_STACK = PinnedChart(
    "https://prometheus-community.github.io/helm-charts",
    "kube-prometheus-stack",
    "87.6.0",
    PROMETHEUS_K8S_NAMESPACE,
)
DCGM_EXPORTER = PinnedChart(
    "https://nvidia.github.io/dcgm-exporter/helm-charts", "dcgm-exporter", "4.8.2", PROMETHEUS_K8S_NAMESPACE
)
# The UIDs the pinned charts' images are built for (kube-prometheus-stack's and Grafana's defaults), set
# explicitly so that a chart upgrade cannot drop the non-root, seccomp and read-only settings unnoticed.
PROMETHEUS_UID = 1000
GRAFANA_UID = 472
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


def _limits(cpu: str, memory: str) -> dict[str, dict[str, str]]:
    return {"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"cpu": cpu, "memory": memory}}


def prometheus_stack_values(config: ObservabilityConfig, topic_arn: str, region: str) -> dict[str, Any]:
    """kube-prometheus-stack values: the team's scrape interval, alert rules and SNS receiver, plus the
    trainer pods' hardening for every component (checked once against a render of 87.6.0 with its pinned
    subcharts: docs/infra.md, "Every workload the stacks apply")."""
    alertmanager_egress = [
        {"ports": [{"protocol": "TCP", "port": 443}]},  # SNS
        DNS_EGRESS,
        POD_IDENTITY_EGRESS,
    ]
    return {
        "prometheusOperator": {
            "networkPolicy": {"enabled": True},
            # The admission webhook's certificate Jobs are pre-install hooks holding a token with cluster
            # rights; the rules here come from this stack only, so the webhook (and its TLS) are off.
            "admissionWebhooks": {"enabled": False},
            "tls": {"enabled": False},
            "resources": _limits("500m", "512Mi"),
            "securityContext": pod_security_context(),
            "containerSecurityContext": container_security_context(),
        },
        "prometheus": {
            "networkPolicy": {
                "enabled": True,
                # Ingress: Grafana's queries and Prometheus itself. Egress stays open: the scrape targets
                # include host-network ports of every node (kubelet, node-exporter, dcgm-exporter).
                "ingress": [
                    {
                        "from": [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "grafana"}}}],
                        "ports": [{"protocol": "TCP", "port": 9090}],
                    },
                    {"from": [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}]},
                ],
                "egress": [{}],
            },
            "prometheusSpec": {
                "scrapeInterval": f"{config.scrape_interval_s}s",
                # Select the trainer chart's PodMonitor and the rules below without Helm release labels.
                "podMonitorSelectorNilUsesHelmValues": False,
                "ruleSelectorNilUsesHelmValues": False,
                "nodeSelector": _SYSTEM_NODES,
                "securityContext": pod_security_context(PROMETHEUS_UID),
                "resources": _limits("2", "4Gi"),
            },
        },
        "additionalPrometheusRulesMap": {
            "nvrx-training": {"groups": [{"name": "nvrx-training", "rules": alert_rules(config.alarms)}]}
        },
        "alertmanager": {
            "networkPolicy": {
                "enabled": True,
                # The chart renders egress rules but enforces only the listed types (default: Ingress).
                "policyTypes": ["Ingress", "Egress"],
                "egress": {"enabled": True, "rules": alertmanager_egress},
            },
            # No Kubernetes API token (its AWS credentials come from the Pod Identity token, injected apart).
            "serviceAccount": {
                "create": True,
                "name": ALERTMANAGER_SA,
                "automountServiceAccountToken": False,
            },
            "alertmanagerSpec": {
                "nodeSelector": _SYSTEM_NODES,
                "securityContext": pod_security_context(PROMETHEUS_UID),
                "resources": _limits("200m", "256Mi"),
            },
            "config": {
                "route": {"receiver": "sns", "group_by": ["alertname", "namespace"]},
                "receivers": [
                    {"name": "sns", "sns_configs": [{"topic_arn": topic_arn, "sigv4": {"region": region}}]}
                ],
            },
        },
        "grafana": {
            "sidecar": {
                "dashboards": {"enabled": True, "label": "grafana_dashboard"},
                "securityContext": {
                    **container_security_context(),
                    "seccompProfile": {"type": "RuntimeDefault"},
                },
                "resources": _limits("200m", "256Mi"),
            },
            "testFramework": {"enabled": False},  # `helm test` pods: never run by the stack
            "networkPolicy": {
                "enabled": True,
                # Egress: DNS (the chart adds UDP 53), the API server for the sidecars, Prometheus.
                "egress": {
                    "enabled": True,
                    "ports": [{"protocol": "TCP", "port": 443}, {"protocol": "TCP", "port": 9090}],
                },
            },
            "resources": _limits("500m", "512Mi"),
            "securityContext": pod_security_context(GRAFANA_UID),
            "containerSecurityContext": {
                **container_security_context(),
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            # Read-only root: what Grafana writes besides its data volume goes to emptyDir.
            "extraEmptyDirMounts": [
                {"name": "grafana-logs", "mountPath": "/var/log/grafana"},
                {"name": "grafana-tmp", "mountPath": "/tmp"},
            ],
        },
        "kube-state-metrics": {
            "networkPolicy": {
                "enabled": True,
                "egress": [{"ports": [{"protocol": "TCP", "port": 443}]}],  # the API server only
            },
            "resources": _limits("200m", "256Mi"),
        },
        "prometheus-node-exporter": {
            # Host network and host /proc, /sys by function (NetworkPolicy does not apply to host-network
            # pods); otherwise the same settings as every other container.
            "securityContext": pod_security_context(),
            "containerSecurityContext": container_security_context(),
            "resources": _limits("200m", "128Mi"),
        },
    }


def dcgm_network_policy() -> dict[str, Any]:
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {"name": DCGM_EXPORTER.chart, "namespace": PROMETHEUS_K8S_NAMESPACE},
        "spec": {
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": DCGM_EXPORTER.chart}},
            "policyTypes": ["Ingress", "Egress"],
            "ingress": [
                {
                    "from": [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}}],
                    "ports": [{"protocol": "TCP", "port": 9400}],
                }
            ],
            "egress": [{"ports": [{"protocol": "TCP", "port": 443}]}],
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
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": SCRAPER, "namespace": ns},
                "automountServiceAccountToken": False,  # the Deployment's pod spec opts in (it lists pods)
            },
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
            self._network_policy(team_namespace),
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
        # The image runs as root by default but needs no privilege: a non-root user with the agent's
        # writable directories (translated config, state, logs) and /tmp on emptyDir volumes.
        writable = [(f"agent-{d}", f"{CLOUDWATCH_AGENT_HOME}/{d}") for d in ("etc", "var", "logs")]
        writable.append(("tmp", "/tmp"))
        # The agent serves no health endpoint: ready once it has translated its config (it starts only
        # then), alive while that file is there; a crashed agent exits and the container restarts.
        started = {
            "exec": {"command": ["test", "-s", f"{CLOUDWATCH_AGENT_HOME}/etc/amazon-cloudwatch-agent.toml"]}
        }
        return {
            "serviceAccountName": SCRAPER,
            # Kept: the agent discovers the trainer pods through the Kubernetes API (its Role: get, list
            # and watch pods in the team namespace only).
            "automountServiceAccountToken": True,
            "nodeSelector": _SYSTEM_NODES,
            "securityContext": pod_security_context(),
            "containers": [
                {
                    "name": "cloudwatch-agent",
                    "image": CLOUDWATCH_AGENT_IMAGE,
                    "resources": {
                        "requests": {"cpu": "200m", "memory": "200Mi"},
                        "limits": {"cpu": "1", "memory": "1Gi"},
                    },
                    "securityContext": container_security_context(),
                    "readinessProbe": {**started, "initialDelaySeconds": 5, "periodSeconds": 10},
                    "livenessProbe": {**started, "initialDelaySeconds": 60, "periodSeconds": 30},
                    "volumeMounts": [
                        {"name": "agent", "mountPath": "/etc/cwagentconfig", "readOnly": True},
                        {"name": "scrape", "mountPath": "/etc/prometheusconfig", "readOnly": True},
                        *({"name": name, "mountPath": path} for name, path in writable),
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
                *({"name": name, "emptyDir": {"sizeLimit": "256Mi"}} for name, _ in writable),
            ],
        }

    @staticmethod
    def _network_policy(team_namespace: str) -> dict[str, Any]:
        """No ingress; egress to the trainer's metrics port in the team namespace, DNS, HTTPS (the API
        server, CloudWatch Logs) and the node's Pod Identity agent (credentials)."""
        return {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {"name": SCRAPER, "namespace": CLOUDWATCH_K8S_NAMESPACE},
            "spec": {
                "podSelector": {"matchLabels": {"app.kubernetes.io/name": SCRAPER}},
                "policyTypes": ["Ingress", "Egress"],
                "egress": [
                    {
                        "to": [
                            {
                                "namespaceSelector": {
                                    "matchLabels": {"kubernetes.io/metadata.name": team_namespace}
                                },
                                "podSelector": {"matchLabels": {"app.kubernetes.io/component": "trainer"}},
                            }
                        ],
                        "ports": [{"protocol": "TCP", "port": TRAINER_METRICS_PORT}],
                    },
                    DNS_EGRESS,
                    {"ports": [{"protocol": "TCP", "port": 443}]},
                    POD_IDENTITY_EGRESS,
                ],
            },
        }


class PrometheusCollection(Construct):
    """kube-prometheus-stack (alerts to the SNS topic, the team's Grafana dashboard) and the DCGM exporter.
    Attributes: `stack`, `dcgm`, `dcgm_policy`, `dashboard` (the Grafana dashboard ConfigMap),
    `alertmanager_role`."""

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
        values = prometheus_stack_values(config, topic.topic_arn, Stack.of(self).region)
        self.stack = self._chart(cluster, "KubePrometheusStack", KUBE_PROMETHEUS_STACK, values)
        self.dcgm = self._chart(
            cluster,
            "DcgmExporter",
            DCGM_EXPORTER,
            {
                "tolerations": [{"key": GPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}],
                "nodeSelector": {NODE_ROLE_LABEL: GPU_NODE_ROLE},
                "serviceMonitor": {"enabled": True},
                # Root with SYS_ADMIN stays (DCGM's profiling metrics need it, the chart's default);
                # the seccomp profile is added.
                "podSecurityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
            },
        )
        self.dcgm.node.add_dependency(self.stack)  # its ServiceMonitor needs the operator's CRDs
        # The chart has no NetworkPolicy: only Prometheus may scrape it; it reaches only the API server.
        self.dcgm_policy = cluster.add_manifest("DcgmExporterPolicy", dcgm_network_policy())
        self.dcgm_policy.node.add_dependency(self.stack)  # the chart creates the namespace
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
