"""GPU managed node group: AL2023 NVIDIA AMI, every EFA interface of the instance type, cluster placement
group, IMDSv2, EFA security group, GPU taint and label, NVMe RAID0, capacity targeting, node auto repair."""

from __future__ import annotations

from typing import cast

from aws_cdk import Fn
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_eks_v2 as eks
from constructs import Construct

from infra.cluster import node_metadata_options
from infra.config import GpuNodeGroupConfig, TeamConfig
from infra.instance_types import efa_interfaces
from infra.network import Network
from infra.nvme_userdata import nvme_raid_user_data

GPU_TAINT_KEY = "nvidia.com/gpu"
GPU_TAINT_VALUE = "true"
NODE_ROLE_LABEL = "blueprint.nvrx/node-role"
GPU_NODE_ROLE = "gpu"

_CAPACITY_TYPES = {
    "on-demand": eks.CapacityType.ON_DEMAND,
    "reservation": eks.CapacityType.ON_DEMAND,
    "capacity-block": eks.CapacityType.CAPACITY_BLOCK,
}


class GpuNodeGroup(Construct):
    """The GPU node group of one team.

    Attributes: `nodegroup`, `efa_security_group`, `launch_template`, `placement_group` (None when the
    capacity reservation or capacity block decides placement).
    """

    def __init__(
        self, scope: Construct, construct_id: str, *, team: TeamConfig, network: Network, cluster: eks.Cluster
    ) -> None:
        super().__init__(scope, construct_id)
        config = team.gpu_node_group
        self.efa_security_group = self._efa_security_group(team, network)
        self.placement_group = self._placement_group(config)
        self.launch_template = self._launch_template(config, cluster)
        self.nodegroup = self._nodegroup(team, network, cluster)
        self.node_monitoring_agent = self._node_monitoring_agent(cluster)

    def _efa_security_group(self, team: TeamConfig, network: Network) -> ec2.SecurityGroup:
        """EFA needs all traffic to and from members of the same group (SRD is not plain TCP/UDP)."""
        group = ec2.SecurityGroup(
            self,
            "EfaSecurityGroup",
            vpc=network.vpc,
            allow_all_outbound=True,
            description=f"EFA traffic between GPU nodes of team {team.name}",
        )
        group.add_ingress_rule(group, ec2.Port.all_traffic(), "EFA: all traffic within the group")
        return group

    def _placement_group(self, config: GpuNodeGroupConfig) -> ec2.CfnPlacementGroup | None:
        """A cluster placement group, for plain on-demand only: a reservation or capacity block already
        fixes where the instances are, and a placement group that does not match it fails every launch."""
        if config.capacity.type != "on-demand":
            return None
        return ec2.CfnPlacementGroup(self, "PlacementGroup", strategy="cluster")

    def _launch_template(self, config: GpuNodeGroupConfig, cluster: eks.Cluster) -> ec2.CfnLaunchTemplate:
        """Instance type, every EFA interface, capacity targeting, IMDSv2 with hop limit 1, encrypted root,
        NVMe RAID0."""
        placement = None
        if self.placement_group is not None:
            placement = ec2.CfnLaunchTemplate.PlacementProperty(group_name=self.placement_group.ref)
        security_groups = [self.efa_security_group.security_group_id, cluster.cluster_security_group_id]
        interfaces = [
            ec2.CfnLaunchTemplate.NetworkInterfaceProperty(
                network_card_index=spec.network_card_index,
                device_index=spec.device_index,
                interface_type=spec.interface_type,
                groups=security_groups,
                delete_on_termination=True,
            )
            for spec in efa_interfaces(config.instance_type)
        ]
        capacity_spec = None
        market = None
        if config.capacity.id is not None:
            capacity_spec = ec2.CfnLaunchTemplate.CapacityReservationSpecificationProperty(
                capacity_reservation_target=ec2.CfnLaunchTemplate.CapacityReservationTargetProperty(
                    capacity_reservation_id=config.capacity.id
                )
            )
        if config.capacity.type == "capacity-block":
            market = ec2.CfnLaunchTemplate.InstanceMarketOptionsProperty(market_type="capacity-block")
        return ec2.CfnLaunchTemplate(
            self,
            "LaunchTemplate",
            launch_template_data=ec2.CfnLaunchTemplate.LaunchTemplateDataProperty(
                # The instance type lives here, not on the node group: CDK's GPU-family check rejects p5
                # with the AL2023 NVIDIA AMI type when instance_types is set on the node group.
                instance_type=config.instance_type,
                network_interfaces=interfaces,
                placement=placement,
                capacity_reservation_specification=capacity_spec,
                instance_market_options=market,
                metadata_options=node_metadata_options(),
                block_device_mappings=[
                    ec2.CfnLaunchTemplate.BlockDeviceMappingProperty(
                        device_name="/dev/xvda",
                        ebs=ec2.CfnLaunchTemplate.EbsProperty(
                            volume_size=config.root_volume_gib,
                            volume_type="gp3",
                            encrypted=True,
                            delete_on_termination=True,
                        ),
                    )
                ],
                user_data=Fn.base64(nvme_raid_user_data()),
            ),
        )

    def _nodegroup(self, team: TeamConfig, network: Network, cluster: eks.Cluster) -> eks.Nodegroup:
        """The managed node group: training nodes plus hot spares, tainted and labelled for the trainer."""
        config = team.gpu_node_group
        return cluster.add_nodegroup_capacity(
            "Gpu",
            nodegroup_name=f"{team.name}-gpu",
            ami_type=eks.NodegroupAmiType.AL2023_X86_64_NVIDIA,
            capacity_type=_CAPACITY_TYPES[config.capacity.type],
            min_size=config.min_nodes,
            desired_size=config.node_count,
            max_size=config.max_nodes,
            subnets=ec2.SubnetSelection(subnets=[network.gpu_subnet]),
            launch_template_spec=eks.LaunchTemplateSpec(
                id=self.launch_template.ref, version=self.launch_template.attr_latest_version_number
            ),
            taints=[
                eks.TaintSpec(effect=eks.TaintEffect.NO_SCHEDULE, key=GPU_TAINT_KEY, value=GPU_TAINT_VALUE)
            ],
            labels={NODE_ROLE_LABEL: GPU_NODE_ROLE},
            # Auto repair replaces nodes the monitoring agent reports unhealthy (GPU/XID, EFA, kubelet).
            enable_node_auto_repair=True,
        )

    def _node_monitoring_agent(self, cluster: eks.Cluster) -> eks.Addon:
        """The add-on whose health reports drive node auto repair."""
        return eks.Addon(
            self,
            "NodeMonitoringAgent",
            cluster=cast(eks.ICluster, cluster),  # jsii stubs: Cluster lacks an ICluster member
            addon_name="eks-node-monitoring-agent",
            preserve_on_delete=False,
        )
