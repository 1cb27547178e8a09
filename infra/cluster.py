"""EKS cluster (aws_eks_v2): managed node groups only, KMS secrets encryption, full control-plane logging,
private endpoint by default, access entries for the team admins, and the system node group."""

from __future__ import annotations

from typing import cast

from aws_cdk import RemovalPolicy
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_eks_v2 as eks
from aws_cdk import aws_kms as kms
from aws_cdk.lambda_layer_kubectl_v35 import KubectlV35Layer
from constructs import Construct

from infra.config import TeamConfig
from infra.network import Network

CONTROL_PLANE_LOG_TYPES = [
    eks.ClusterLoggingTypes.API,
    eks.ClusterLoggingTypes.AUDIT,
    eks.ClusterLoggingTypes.AUTHENTICATOR,
    eks.ClusterLoggingTypes.CONTROLLER_MANAGER,
    eks.ClusterLoggingTypes.SCHEDULER,
]


def endpoint_access(team: TeamConfig) -> eks.EndpointAccess:
    """The API server endpoint: private only, or public restricted to the configured CIDRs."""
    if team.endpoint_access == "private":
        return eks.EndpointAccess.PRIVATE
    return eks.EndpointAccess.PUBLIC_AND_PRIVATE.only_from(*team.endpoint_public_cidrs)


class Cluster(Construct):
    """The team's EKS cluster.

    Attributes: `cluster` (eks_v2.Cluster), `secrets_key`, `system_nodegroup`.
    """

    def __init__(self, scope: Construct, construct_id: str, *, team: TeamConfig, network: Network) -> None:
        super().__init__(scope, construct_id)
        self.secrets_key = kms.Key(
            self,
            "SecretsKey",
            description=f"EKS secrets envelope encryption for team {team.name}",
            enable_key_rotation=True,
            # Deleting the key would make the cluster's secrets unreadable; keep it past the stack.
            removal_policy=RemovalPolicy.RETAIN,
        )
        self.cluster = eks.Cluster(
            self,
            "Cluster",
            cluster_name=team.name,
            version=eks.KubernetesVersion.of(team.kubernetes_version),
            vpc=network.vpc,
            vpc_subnets=[ec2.SubnetSelection(subnets=network.private_subnets)],
            endpoint_access=endpoint_access(team),
            cluster_logging=CONTROL_PLANE_LOG_TYPES,
            secrets_encryption_key=self.secrets_key,
            # Managed node groups, not EKS Auto Mode (the GPU nodes need a custom launch template).
            default_capacity_type=eks.DefaultCapacityType.NODEGROUP,
            default_capacity=0,
            kubectl_provider_options=eks.KubectlProviderOptions(
                kubectl_layer=KubectlV35Layer(self, "KubectlLayer"),
            ),
        )
        for i, arn in enumerate(team.admin_principal_arns):
            self.cluster.grant_access(
                f"Admin{i}",
                arn,
                [
                    eks.AccessPolicy.from_access_policy_name(
                        "AmazonEKSClusterAdminPolicy", access_scope_type=eks.AccessScopeType.CLUSTER
                    )
                ],
            )

        system = team.system_node_group
        self.system_nodegroup = self.cluster.add_nodegroup_capacity(
            "System",
            nodegroup_name=f"{team.name}-system",
            instance_types=[ec2.InstanceType(system.instance_type)],
            ami_type=eks.NodegroupAmiType.AL2023_X86_64_STANDARD,
            min_size=system.min_nodes,
            desired_size=system.desired_nodes,
            max_size=system.max_nodes,
            subnets=ec2.SubnetSelection(subnets=network.private_subnets),
            launch_template_spec=_imdsv2_template(self, "SystemLaunchTemplate"),
            enable_node_auto_repair=True,
            labels={"blueprint.nvrx/node-role": "system"},
        )
        # Pod Identity is how add-ons (FSx CSI) get AWS credentials; the node role keeps only node duties.
        self.pod_identity_agent = eks.Addon(
            self,
            "PodIdentityAgent",
            cluster=cast(eks.ICluster, self.cluster),  # jsii stubs: Cluster lacks an ICluster member
            addon_name="eks-pod-identity-agent",
            preserve_on_delete=False,
        )


def node_metadata_options() -> ec2.CfnLaunchTemplate.MetadataOptionsProperty:
    """IMDSv2 only, hop limit 1, for every node that runs pods: a PUT from a pod's network namespace
    crosses one more hop and gets no token, so pods cannot read the node role's credentials. Host-network
    agents (VPC CNI, Pod Identity agent, kube-proxy) still reach IMDS; add-ons that call AWS take their own
    credentials from EKS Pod Identity (docs/infra.md, "No node credentials in pods")."""
    return ec2.CfnLaunchTemplate.MetadataOptionsProperty(
        http_tokens="required", http_put_response_hop_limit=1, http_endpoint="enabled"
    )


def _imdsv2_template(scope: Construct, construct_id: str) -> eks.LaunchTemplateSpec:
    """A launch template with the node metadata options only (everything else stays the group's default)."""
    template = ec2.CfnLaunchTemplate(
        scope,
        construct_id,
        launch_template_data=ec2.CfnLaunchTemplate.LaunchTemplateDataProperty(
            metadata_options=node_metadata_options(),
        ),
    )
    return eks.LaunchTemplateSpec(id=template.ref, version=template.attr_latest_version_number)
