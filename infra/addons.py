"""Cluster add-ons: the VPC CNI with network-policy enforcement, the NVIDIA and EFA device plugins as pinned
Helm charts, and the team namespace with its nvidia.com/gpu ResourceQuota and the trainer's service
account."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_iam as iam
from constructs import Construct

from infra.config import TeamConfig
from infra.gpu_nodegroup import GPU_NODE_ROLE, GPU_TAINT_KEY, NODE_ROLE_LABEL

TRAINER_SERVICE_ACCOUNT = "trainer"
VPC_CNI_SERVICE_ACCOUNT = "aws-node"  # kube-system, the VPC CNI DaemonSet's service account


def pod_identity_role(scope: Construct, construct_id: str, description: str) -> iam.Role:
    """An IAM role that EKS Pod Identity hands to one service account (sts:AssumeRole + sts:TagSession)."""
    return iam.Role(
        scope,
        construct_id,
        assumed_by=iam.ServicePrincipal("pods.eks.amazonaws.com").with_session_tags(),
        description=description,
    )


@dataclass(frozen=True)
class PinnedChart:
    """A Helm chart pinned to repository, name and version."""

    repository: str
    chart: str
    version: str
    namespace: str = "kube-system"


NVIDIA_DEVICE_PLUGIN = PinnedChart(
    "https://nvidia.github.io/k8s-device-plugin", "nvidia-device-plugin", "0.18.2"
)
EFA_DEVICE_PLUGIN = PinnedChart("https://aws.github.io/eks-charts", "aws-efa-k8s-device-plugin", "v0.5.29")

# The VPC CNI enforces NetworkPolicy only with its network-policy agent on; the chart's policies (the only
# boundary around the trainer's unauthenticated stores) are inert without it.
VPC_CNI_CONFIGURATION = {"enableNetworkPolicy": "true"}

_GPU_TOLERATIONS = [
    {"key": GPU_TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"},
    {"key": "CriticalAddonsOnly", "operator": "Exists"},
]
# Both plugins run on GPU nodes only. The NVIDIA chart's default affinity wants Node Feature Discovery
# labels these nodes do not carry; a list value replaces the chart's list, so this selects our label.
_GPU_NODE_AFFINITY = {
    "nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [
                {"matchExpressions": [{"key": NODE_ROLE_LABEL, "operator": "In", "values": [GPU_NODE_ROLE]}]}
            ]
        }
    }
}


def device_plugin_values() -> dict[str, dict[str, Any]]:
    """Helm values of the two device plugins, keyed by chart name."""
    return {
        NVIDIA_DEVICE_PLUGIN.chart: {"tolerations": _GPU_TOLERATIONS, "affinity": _GPU_NODE_AFFINITY},
        EFA_DEVICE_PLUGIN.chart: {
            "tolerations": _GPU_TOLERATIONS,
            "nodeSelector": {NODE_ROLE_LABEL: GPU_NODE_ROLE},
        },
    }


class ClusterAddons(Construct):
    """Device plugins and the team namespace.

    Attributes: `vpc_cni`, `vpc_cni_role`, `namespace` (the Namespace manifest others depend on),
    `namespace_objects` (quota and service account), `nvidia_device_plugin`, `efa_device_plugin`.
    """

    def __init__(
        self, scope: Construct, construct_id: str, *, team: TeamConfig, cluster: eks.Cluster
    ) -> None:
        super().__init__(scope, construct_id)
        # The CNI's own credentials through Pod Identity rather than the node role (IMDS hop limit 1 keeps
        # pods off the node role; aws-node is host-network, but its IP management gets a role of its own).
        self.vpc_cni_role = pod_identity_role(
            self, "VpcCniRole", "VPC CNI (EKS Pod Identity): ENI and IP management"
        )
        self.vpc_cni_role.add_managed_policy(
            iam.ManagedPolicy.from_aws_managed_policy_name("AmazonEKS_CNI_Policy")
        )
        # EKS installs the VPC CNI unmanaged with every cluster; the managed add-on takes it over
        # (OVERWRITE) and is kept on stack deletion, so nodes keep their networking while the stack goes.
        self.vpc_cni = eks.CfnAddon(
            self,
            "VpcCni",
            cluster_name=cluster.cluster_name,
            addon_name="vpc-cni",
            resolve_conflicts="OVERWRITE",
            preserve_on_delete=True,
            configuration_values=json.dumps(VPC_CNI_CONFIGURATION),
            pod_identity_associations=[
                eks.CfnAddon.PodIdentityAssociationProperty(
                    role_arn=self.vpc_cni_role.role_arn, service_account=VPC_CNI_SERVICE_ACCOUNT
                )
            ],
        )
        values = device_plugin_values()
        self.nvidia_device_plugin = self._chart(cluster, "NvidiaDevicePlugin", NVIDIA_DEVICE_PLUGIN, values)
        self.efa_device_plugin = self._chart(cluster, "EfaDevicePlugin", EFA_DEVICE_PLUGIN, values)

        self.namespace = cluster.add_manifest(
            "TeamNamespace",
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": team.name}},
        )
        self.namespace_objects = cluster.add_manifest(
            "TeamNamespaceObjects",
            {
                "apiVersion": "v1",
                "kind": "ResourceQuota",
                "metadata": {"name": "gpu-quota", "namespace": team.name},
                "spec": {"hard": {"requests.nvidia.com/gpu": str(team.effective_gpu_quota)}},
            },
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": TRAINER_SERVICE_ACCOUNT, "namespace": team.name},
                # The trainer talks to its peers and FSx, never to the Kubernetes API.
                "automountServiceAccountToken": False,
            },
        )
        self.namespace_objects.node.add_dependency(self.namespace)

    @staticmethod
    def _chart(
        cluster: eks.Cluster, construct_id: str, pinned: PinnedChart, values: dict[str, dict[str, Any]]
    ) -> eks.HelmChart:
        return cluster.add_helm_chart(
            construct_id,
            repository=pinned.repository,
            chart=pinned.chart,
            version=pinned.version,
            namespace=pinned.namespace,
            release=pinned.chart,
            values=values[pinned.chart],
        )
