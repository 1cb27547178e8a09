"""The deploy-time check of the team's S3 bucket linked to FSx (`fsx.s3_path`): a custom resource whose
Lambda (infra/lambdas/s3_bucket_check) reads the bucket's public access block, policy and encryption and
fails the deploy, before the data repository association exists, unless the bucket is TLS only, blocks
public access and is encrypted. The Lambda may read those three settings of that bucket and nothing else."""

from __future__ import annotations

from pathlib import Path

from aws_cdk import CustomResource, Duration, RemovalPolicy, Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from constructs import Construct

from infra.log_encryption import encrypted_log_group

HANDLER_DIR = Path(__file__).resolve().parent / "lambdas" / "s3_bucket_check"
CHECK_ACTIONS = ["s3:GetBucketPublicAccessBlock", "s3:GetBucketPolicy", "s3:GetEncryptionConfiguration"]


def bucket_of(s3_path: str) -> str:
    """`s3://bucket/prefix` -> `bucket` (the teams file already validated the form)."""
    return s3_path.removeprefix("s3://").split("/", 1)[0]


class S3BucketCheck(Construct):
    """Attributes: `function`, `resource` (make the association depend on it), `log_key`."""

    def __init__(self, scope: Construct, construct_id: str, *, s3_path: str) -> None:
        super().__init__(scope, construct_id)
        bucket = bucket_of(s3_path)
        stack_name = Stack.of(self).stack_name
        # Its log lines name the bucket and why it failed; encrypted like every log group of the stack.
        # Deleted with the stack: they describe a deploy that no longer exists.
        self.log_key, log_group = encrypted_log_group(
            self,
            "LogsKey",
            "Logs",
            group_name=f"/nvrx-blueprint/{stack_name}/s3-bucket-check",
            description=f"Logs of the deploy-time S3 bucket check of stack {stack_name}",
            removal_policy=RemovalPolicy.DESTROY,
        )
        # An explicit role (not the default one with AWSLambdaBasicExecutionRole): its log group and the
        # three read actions on this one bucket.
        role = iam.Role(
            self,
            "Role",
            assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
            description=f"Deploy-time check of the FSx-linked bucket {bucket}",
        )
        log_group.grant_write(role)
        role.add_to_policy(
            iam.PolicyStatement(
                actions=CHECK_ACTIONS,
                resources=[Stack.of(self).format_arn(service="s3", region="", account="", resource=bucket)],
            )
        )
        self.function = lambda_.Function(
            self,
            "Function",
            runtime=lambda_.Runtime.PYTHON_3_14,
            handler="index.handler",
            code=lambda_.Code.from_asset(str(HANDLER_DIR), exclude=["__pycache__", "*.pyc", "__init__.py"]),
            role=role,
            log_group=log_group,
            timeout=Duration.seconds(60),
            description=f"Refuses to link {bucket} to FSx unless it is TLS only, private and encrypted",
        )
        self.resource = CustomResource(
            self,
            "Check",
            service_token=self.function.function_arn,
            resource_type="Custom::S3BucketCheck",
            # CloudFormation invokes the function asynchronously and waits for its answer (an hour by
            # default). The handler answers every request itself, so a wait this long means the function
            # never ran to its answer (throttled, or failed after Lambda's two retries, 1 and 2 minutes
            # apart): the deploy fails after 10 minutes instead.
            service_timeout=Duration.minutes(10),
            properties={"Bucket": bucket},
        )
