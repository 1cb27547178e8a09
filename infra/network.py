"""Team VPC: public and private subnets over explicit AZs, one GPU subnet, endpoints, flow logs."""

from __future__ import annotations

import ipaddress

from aws_cdk import RemovalPolicy, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from constructs import Construct

from infra.config import NetworkConfig
from infra.log_encryption import encrypted_log_group

# Interface endpoints private nodes use without the NAT: image pulls (ECR), credentials (STS, EKS Auth for
# Pod Identity), node bootstrap (EC2, EKS) and logs. S3 is a (free) gateway endpoint: ECR layers live there.
_INTERFACE_ENDPOINTS: dict[str, ec2.InterfaceVpcEndpointAwsService] = {
    "EcrApi": ec2.InterfaceVpcEndpointAwsService.ECR,
    "EcrDkr": ec2.InterfaceVpcEndpointAwsService.ECR_DOCKER,
    "Sts": ec2.InterfaceVpcEndpointAwsService.STS,
    "Ec2": ec2.InterfaceVpcEndpointAwsService.EC2,
    "Eks": ec2.InterfaceVpcEndpointAwsService.EKS,
    "EksAuth": ec2.InterfaceVpcEndpointAwsService.EKS_AUTH,
    "Logs": ec2.InterfaceVpcEndpointAwsService.CLOUDWATCH_LOGS,
}


def gpu_subnet_cidr(vpc_cidr: str) -> str:
    """The GPU subnet: the top quarter (/18) of the VPC, clear of the /24 public and /20 private subnets,
    which CDK packs from the bottom (6 AZs use at most the first half)."""
    net = ipaddress.ip_network(vpc_cidr)
    return str(list(net.subnets(new_prefix=net.prefixlen + 2))[-1])


class Network(Construct):
    """The VPC of one team.

    Attributes: `vpc`, `gpu_subnet` (the one subnet GPU nodes and FSx use), `private_subnets` (system nodes,
    control-plane ENIs, endpoints), `flow_log_key` (encrypts the flow logs).
    """

    def __init__(self, scope: Construct, construct_id: str, *, config: NetworkConfig) -> None:
        super().__init__(scope, construct_id)
        self.vpc = ec2.Vpc(
            self,
            "Vpc",
            ip_addresses=ec2.IpAddresses.cidr(config.vpc_cidr),
            # Explicit AZs: synth never looks them up (no AWS call, no cdk.context.json).
            availability_zones=list(config.availability_zones),
            nat_gateways=config.nat_gateways,
            # The first NAT gateway sits in the GPU AZ, so GPU egress never crosses AZs.
            nat_gateway_subnets=ec2.SubnetSelection(
                subnet_group_name="public",
                availability_zones=_gpu_az_first(config),
            ),
            subnet_configuration=[
                ec2.SubnetConfiguration(name="public", subnet_type=ec2.SubnetType.PUBLIC, cidr_mask=24),
                ec2.SubnetConfiguration(
                    name="private", subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS, cidr_mask=20
                ),
            ],
            enable_dns_hostnames=True,
            enable_dns_support=True,
            restrict_default_security_group=True,
        )
        self.private_subnets = list(self.vpc.private_subnets)

        gpu_cidr = gpu_subnet_cidr(config.vpc_cidr)
        for subnet in [*self.vpc.public_subnets, *self.vpc.private_subnets]:
            if ipaddress.ip_network(subnet.ipv4_cidr_block).overlaps(ipaddress.ip_network(gpu_cidr)):
                raise ValueError(f"GPU subnet {gpu_cidr} overlaps {subnet.ipv4_cidr_block}")
        self.gpu_subnet = ec2.PrivateSubnet(
            self,
            "GpuSubnet",
            vpc_id=self.vpc.vpc_id,
            availability_zone=config.gpu_availability_zone,
            cidr_block=gpu_cidr,
            map_public_ip_on_launch=False,
        )
        self.gpu_subnet.add_default_nat_route(self._nat_gateway_id(config.gpu_availability_zone))

        self.vpc.add_gateway_endpoint(
            "S3",
            service=ec2.GatewayVpcEndpointAwsService.S3,
            subnets=[ec2.SubnetSelection(subnets=[*self.private_subnets, self.gpu_subnet])],
        )
        for name, service in _INTERFACE_ENDPOINTS.items():
            endpoint = self.vpc.add_interface_endpoint(
                name,
                service=service,
                private_dns_enabled=True,
                open=False,
                subnets=ec2.SubnetSelection(subnets=self.private_subnets),
            )
            # HTTPS from the VPC only, written as the literal CIDR (a token CIDR cannot be reviewed).
            endpoint.connections.allow_default_port_from(ec2.Peer.ipv4(config.vpc_cidr), "HTTPS from the VPC")

        self.flow_log_key, flow_log_group = self._flow_log_group()
        self.vpc.add_flow_log(
            "FlowLog",
            destination=ec2.FlowLogDestination.to_cloud_watch_logs(flow_log_group),
            traffic_type=ec2.FlowLogTrafficType.REJECT,
        )

    def _flow_log_group(self) -> tuple[kms.Key, logs.LogGroup]:
        """The flow logs' group, encrypted with a key CloudWatch Logs may use for this group only."""
        stack_name = Stack.of(self).stack_name
        return encrypted_log_group(
            self,
            "FlowLogsKey",
            "FlowLogs",
            group_name=f"/nvrx-blueprint/{stack_name}/vpc-flow-logs",
            description=f"VPC flow logs of stack {stack_name}",
            # Retained with the stack's other evidence: a year of flow logs outlives the stack.
            removal_policy=RemovalPolicy.RETAIN,
        )

    def _nat_gateway_id(self, az: str) -> str:
        for subnet in self.vpc.public_subnets:
            if subnet.availability_zone == az and isinstance(subnet, ec2.PublicSubnet):
                gateway = subnet.node.try_find_child("NATGateway")
                if gateway is not None:
                    return str(gateway.ref)  # type: ignore[attr-defined]
        raise ValueError(f"no NAT gateway in {az}")


def _gpu_az_first(config: NetworkConfig) -> list[str]:
    """AZs that get NAT gateways: the GPU AZ first, then the others in file order."""
    others = [az for az in config.availability_zones if az != config.gpu_availability_zone]
    return [config.gpu_availability_zone, *others][: config.nat_gateways]
