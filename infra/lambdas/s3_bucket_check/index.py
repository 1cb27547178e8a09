"""Deploy-time check of a team's own S3 bucket linked to FSx (CloudFormation custom resource handler).

The stack cannot change the policy of a bucket it did not create (a bucket has one policy, the team's), so
it refuses to link one that is not safe for checkpoints: TLS only (a Deny for aws:SecureTransport=false),
every public access block on, default encryption configured. A bucket that fails stops the deploy with one
line naming `fsx.s3_path`. Standard library and boto3 only (the Lambda runtime's own).
"""

from __future__ import annotations

import json
import urllib.request
from typing import Any

PUBLIC_ACCESS_BLOCKS = ("BlockPublicAcls", "IgnorePublicAcls", "BlockPublicPolicy", "RestrictPublicBuckets")


def _denies_plain_http(statement: dict[str, Any]) -> bool:
    if statement.get("Effect") != "Deny" or statement.get("Principal") not in ("*", {"AWS": "*"}):
        return False
    actions = statement.get("Action")
    actions = [actions] if isinstance(actions, str) else actions or []
    if "s3:*" not in actions and "*" not in actions:
        return False
    condition = statement.get("Condition", {}).get("Bool", {})
    return str(condition.get("aws:SecureTransport", "")).lower() == "false"


def bucket_problems(
    public_access_block: dict[str, Any] | None, policy: str | None, encryption: dict[str, Any] | None
) -> list[str]:
    """What makes the bucket unsafe, from the three S3 API answers (None: the bucket has no such
    configuration); an empty list means the bucket passes."""
    problems = []
    if public_access_block is None or not all(public_access_block.get(k) for k in PUBLIC_ACCESS_BLOCKS):
        problems.append("its public access block is not fully on (all four settings)")
    statements = json.loads(policy).get("Statement", []) if policy else []
    if isinstance(statements, dict):
        statements = [statements]
    if not any(_denies_plain_http(s) for s in statements):
        problems.append(
            "its policy does not deny requests without TLS (Deny s3:* when aws:SecureTransport is false)"
        )
    if not (encryption or {}).get("Rules"):
        problems.append("it has no default encryption")
    return problems


def _read(call: Any, key: str, missing_code: str) -> Any:
    """One S3 Get*; None when the bucket has no such configuration (botocore's ClientError carries the
    code in `response`; anything else propagates)."""
    try:
        return call()[key]
    except Exception as err:
        if getattr(err, "response", {}).get("Error", {}).get("Code") == missing_code:
            return None
        raise


def check_bucket(bucket: str, s3: Any) -> list[str]:
    pab = _read(
        lambda: s3.get_public_access_block(Bucket=bucket),
        "PublicAccessBlockConfiguration",
        "NoSuchPublicAccessBlockConfiguration",
    )
    policy = _read(lambda: s3.get_bucket_policy(Bucket=bucket), "Policy", "NoSuchBucketPolicy")
    encryption = _read(
        lambda: s3.get_bucket_encryption(Bucket=bucket),
        "ServerSideEncryptionConfiguration",
        "ServerSideEncryptionConfigurationNotFoundError",
    )
    return bucket_problems(pab, policy, encryption)


def _respond(event: dict[str, Any], status: str, reason: str) -> None:
    body = json.dumps(
        {
            "Status": status,
            "Reason": reason,
            "PhysicalResourceId": event.get("PhysicalResourceId")
            or f"s3-bucket-check-{event['ResourceProperties']['Bucket']}",
            "StackId": event["StackId"],
            "RequestId": event["RequestId"],
            "LogicalResourceId": event["LogicalResourceId"],
        }
    ).encode()
    request = urllib.request.Request(
        event["ResponseURL"],
        data=body,
        method="PUT",
        headers={"Content-Type": "", "Content-Length": str(len(body))},
    )
    with urllib.request.urlopen(request, timeout=30):
        pass


def handler(event: dict[str, Any], context: Any, s3: Any = None) -> None:
    bucket = event["ResourceProperties"]["Bucket"]
    if event["RequestType"] == "Delete":  # nothing was created
        _respond(event, "SUCCESS", "nothing to delete")
        return
    try:
        if s3 is None:
            import boto3

            s3 = boto3.client("s3")
        problems = check_bucket(bucket, s3)
    except Exception as err:  # an unreadable bucket is a failed check, reported, never a hung stack
        problems = [f"its settings could not be read ({type(err).__name__}: {err})"]
    if problems:
        _respond(
            event,
            "FAILED",
            f"fsx.s3_path: bucket {bucket} is not safe for checkpoints: " + "; ".join(problems),
        )
    else:
        _respond(event, "SUCCESS", f"bucket {bucket}: TLS only, public access blocked, encrypted")
