"""A CloudWatch Logs group encrypted with a KMS key of its own, which CloudWatch Logs may use for that one
group only (https://docs.aws.amazon.com/AmazonCloudWatch/latest/logs/encrypt-log-data-kms.html).

The group has a fixed name so that the key policy can name it: a generated name would make the key depend
on the group and the group on the key."""

from __future__ import annotations

from aws_cdk import ArnFormat, RemovalPolicy, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from constructs import Construct


def encrypted_log_group(
    scope: Construct,
    key_id: str,
    group_id: str,
    *,
    group_name: str,
    description: str,
    removal_policy: RemovalPolicy,
) -> tuple[kms.Key, logs.LogGroup]:
    """The key (rotated yearly) and the group (one year's retention), both with `removal_policy`: a key
    deleted while its logs are kept would make them unreadable."""
    stack = Stack.of(scope)
    key = kms.Key(
        scope, key_id, description=description, enable_key_rotation=True, removal_policy=removal_policy
    )
    key.add_to_resource_policy(
        iam.PolicyStatement(
            # The regional CloudWatch Logs principal (amazonaws.com.cn in China: the URL suffix).
            principals=[iam.ServicePrincipal(f"logs.{stack.region}.{stack.url_suffix}")],
            actions=[
                "kms:Encrypt*",
                "kms:Decrypt*",
                "kms:ReEncrypt*",
                "kms:GenerateDataKey*",
                "kms:Describe*",
            ],
            resources=["*"],  # in a key policy, "*" is this key
            conditions={
                "ArnEquals": {
                    "kms:EncryptionContext:aws:logs:arn": stack.format_arn(
                        service="logs",
                        resource="log-group",
                        resource_name=group_name,
                        arn_format=ArnFormat.COLON_RESOURCE_NAME,
                    )
                }
            },
        )
    )
    group = logs.LogGroup(
        scope,
        group_id,
        log_group_name=group_name,
        encryption_key=key,
        retention=logs.RetentionDays.ONE_YEAR,
        removal_policy=removal_policy,
    )
    group.node.add_dependency(key)  # the key policy must allow CloudWatch Logs before the group uses it
    return key, group
