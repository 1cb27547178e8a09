"""cdk-nag AwsSolutions acknowledgements, each scoped to the construct it is about and with the reason a
reviewer would accept. Everything not listed here must pass (tests assert zero unacknowledged findings).

cdk-nag's EKS1/EKS2 rules match only aws_eks v1 resources and skip aws_eks_v2; tests/infra check endpoint
access and control-plane logging directly instead.
"""

from __future__ import annotations

from aws_cdk import Acknowledgment, CfnCondition, Stack, Validations
from aws_cdk import aws_lambda as lambda_
from constructs import IConstruct

from infra.collectors import CloudWatchCollection
from infra.team_stack import TeamStack
from infra.teams.aws_rules import partition_of

_PREFIX = "AwsSolutions::AwsSolutions-"


def _managed(name: str) -> str:
    return f"IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/{name}]"


_NODE_ROLE_POLICIES = (
    "AmazonEKSWorkerNodePolicy",
    "AmazonEKS_CNI_Policy",
    "AmazonEC2ContainerRegistryReadOnly",
)
_NODE_ROLE_REASON = (
    "EKS managed node groups need these AWS-maintained node policies (join the cluster, run the VPC CNI, "
    "pull from ECR); AWS updates them as EKS evolves, which a customer-managed copy would not track."
)
_CLUSTER_ROLE_REASON = (
    "The EKS service role must carry AmazonEKSClusterPolicy; it is the documented, AWS-maintained policy "
    "for the control plane."
)
_KUBECTL_REASON = (
    "Part of CDK's aws_eks_v2 kubectl provider (a CDK-owned custom resource that runs kubectl/helm in the "
    "VPC): its runtime, managed Lambda execution policies and asset-bucket read grants are set by CDK, "
    "are scoped to this stack's bootstrap bucket and handler, and cannot be changed without forking CDK."
)


_CLOUDWATCH_AGENT_REASON = (
    "The CloudWatch agents (Container Insights add-on and the trainer scraper) use the AWS-maintained "
    "CloudWatchAgentServerPolicy that the add-on documents; AWS updates it as the agent gains metrics."
)


_VPC_CNI_REASON = (
    "The VPC CNI's Pod Identity role carries the AWS-maintained AmazonEKS_CNI_Policy that EKS documents for "
    "the CNI; AWS updates it as the CNI gains features (ENI, prefix and IPv6 management)."
)


def _ack(scope: IConstruct, findings: list[str], reason: str) -> None:
    for finding in findings:
        Validations.of(scope).acknowledge(Acknowledgment(id=f"{_PREFIX}{finding}", reason=reason))


def _kubectl_findings(stack: Stack, provider: IConstruct, partition: str) -> list[str]:
    handler = provider.node.find_child("Handler").node.default_child
    assert isinstance(handler, lambda_.CfnFunction)
    handler_id = stack.resolve(stack.get_logical_id(handler))
    bucket = f"cdk-hnb659fds-assets-{stack.account}-{stack.region}"
    return [
        "L1",
        _managed("service-role/AWSLambdaBasicExecutionRole"),
        _managed("service-role/AWSLambdaVPCAccessExecutionRole"),
        _managed("AmazonEC2ContainerRegistryReadOnly"),
        'IAM4[Policy::{"Fn::If":["' + _ecr_public_condition_id(stack, provider) + '",{"Fn::Join":'
        '["",["arn:",{"Ref":"AWS::Partition"},":iam::aws:policy/AmazonElasticContainerRegistryPublicReadOnly"]]}'
        ',{"Ref":"AWS::NoValue"}]}]',
        "IAM5[Action::s3:GetBucket*]",
        "IAM5[Action::s3:GetObject*]",
        "IAM5[Action::s3:List*]",
        # The bucket ARN reads arn:<the region's partition>:... (aws, aws-cn, aws-us-gov) or
        # arn:<AWS::Partition>:... depending on the @aws-cdk/core:enablePartitionLiterals flag; apps built
        # without cdk.json's context get the latter.
        f"IAM5[Resource::arn:{partition}:s3:::{bucket}/*]",
        f"IAM5[Resource::arn:<AWS::Partition>:s3:::{bucket}/*]",
        f"IAM5[Resource::<{handler_id}.Arn>:*]",
    ]


def _ecr_public_condition_id(stack: Stack, provider: IConstruct) -> str:
    """Logical id of the CfnCondition CDK adds to attach the ECR Public policy only where it exists."""
    for child in provider.node.find_all():
        if isinstance(child, CfnCondition) and child.node.id.startswith("HasEcrPublic"):
            return str(stack.resolve(stack.get_logical_id(child)))
    raise LookupError("kubectl provider has no HasEcrPublic condition (CDK changed; revisit nag.py)")


def acknowledge_findings(stack: TeamStack) -> None:
    """Acknowledge the accepted findings of one team stack."""
    cluster = stack.cluster.cluster
    _ack(cluster.role, [_managed("AmazonEKSClusterPolicy")], _CLUSTER_ROLE_REASON)
    for nodegroup in (stack.cluster.system_nodegroup, stack.gpu.nodegroup):
        _ack(nodegroup.role, [_managed(p) for p in _NODE_ROLE_POLICIES], _NODE_ROLE_REASON)
    _ack(stack.addons.vpc_cni_role, [_managed("AmazonEKS_CNI_Policy")], _VPC_CNI_REASON)
    collection = stack.observability.collection
    if isinstance(collection, CloudWatchCollection):
        _ack(collection.role, [_managed("CloudWatchAgentServerPolicy")], _CLOUDWATCH_AGENT_REASON)
    provider = cluster.node.try_find_child("KubectlProvider")
    if provider is not None:
        _ack(provider, _kubectl_findings(stack, provider, partition_of(stack.team.region)), _KUBECTL_REASON)
