"""The team's checkpoint key (docs/design.md, "Team checkpoint key" and Contract 5): a Kubernetes Secret
`checkpoint-key` (data key `checkpoint.key`: 32 random bytes written as 64 hex characters) in the team
namespace, which the trainer chart mounts to sign and verify checkpoint manifests.

The value never passes through CloudFormation: the stack applies a one-shot hardened Job that generates the
bytes in the pod and creates the Secret through the API only if it is absent (infra/incluster/
create_checkpoint_key.py). Every job of the team shares the key, so checkpoints outlive jobs; etcd holds it
encrypted under the cluster's KMS secrets key. Rotation: delete the Secret and re-run the Job (checkpoints
signed with the old key are then refused, as the design intends).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from aws_cdk import aws_eks_v2 as eks
from constructs import Construct

from infra.gpu_nodegroup import NODE_ROLE_LABEL
from infra.workload_security import container_security_context, pod_security_context

CHECKPOINT_KEY_SECRET = "checkpoint-key"
CHECKPOINT_KEY_FIELD = "checkpoint.key"  # docs/design.md Contract 5 (the chart mounts this file)
INITIALIZER = "checkpoint-key-initializer"
# A plain Python image: the script needs only the standard library.
INITIALIZER_IMAGE = "public.ecr.aws/docker/library/python:3.13.1-slim"
SCRIPT = Path(__file__).resolve().parent / "incluster" / "create_checkpoint_key.py"
_SCRIPT_DIR = "/opt/checkpoint-key"
_LABELS = {"app.kubernetes.io/name": INITIALIZER}


def initializer_job_spec(script_config_map: str) -> dict[str, Any]:
    """The Job spec: non-root, read-only root, no capabilities, a deadline, the system nodes."""
    return {
        "backoffLimit": 3,
        # A one-shot pod that serves nothing has no probes; the deadline bounds a hung API call instead.
        "activeDeadlineSeconds": 300,
        "template": {
            "metadata": {"labels": _LABELS},
            "spec": {
                "serviceAccountName": INITIALIZER,
                # It calls the Kubernetes API (create one Secret), so it needs its token.
                "automountServiceAccountToken": True,
                "restartPolicy": "OnFailure",
                "nodeSelector": {NODE_ROLE_LABEL: "system"},
                "securityContext": pod_security_context(),
                "containers": [
                    {
                        "name": "create-key",
                        "image": INITIALIZER_IMAGE,
                        "command": ["python3", f"{_SCRIPT_DIR}/{SCRIPT.name}"],
                        "env": [
                            {
                                "name": "POD_NAMESPACE",
                                "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
                            },
                            {"name": "SECRET_NAME", "value": CHECKPOINT_KEY_SECRET},
                            {"name": "SECRET_KEY", "value": CHECKPOINT_KEY_FIELD},
                            {"name": "PYTHONDONTWRITEBYTECODE", "value": "1"},
                        ],
                        "securityContext": container_security_context(),
                        "resources": {
                            "requests": {"cpu": "50m", "memory": "64Mi"},
                            "limits": {"cpu": "200m", "memory": "128Mi"},
                        },
                        "volumeMounts": [
                            {"name": "script", "mountPath": _SCRIPT_DIR, "readOnly": True},
                            {"name": "tmp", "mountPath": "/tmp"},
                        ],
                    }
                ],
                "volumes": [
                    {"name": "script", "configMap": {"name": script_config_map, "defaultMode": 0o444}},
                    {"name": "tmp", "emptyDir": {"sizeLimit": "16Mi"}},
                ],
            },
        },
    }


def initializer_manifests(namespace: str) -> list[dict[str, Any]]:
    """ServiceAccount, Role (create Secrets in the team namespace), RoleBinding, the script ConfigMap, the
    Job (named after a digest of its spec and script: a changed Job is a new Job, never a refused update)
    and a NetworkPolicy (no ingress; egress to port 443 only, the API server)."""
    script = SCRIPT.read_text(encoding="utf-8")
    config_map = f"{INITIALIZER}-script"
    spec = initializer_job_spec(config_map)
    digest = hashlib.sha256((json.dumps(spec, sort_keys=True) + script).encode()).hexdigest()[:6]
    meta = {"namespace": namespace, "labels": _LABELS}
    return [
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"name": INITIALIZER, **meta},
            "automountServiceAccountToken": False,  # only the Job's pod mounts it (its spec says so)
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": INITIALIZER, **meta},
            # `create` cannot be limited to one name by RBAC; the Role is namespaced and the token lives
            # only in this short pod.
            "rules": [{"apiGroups": [""], "resources": ["secrets"], "verbs": ["create"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": INITIALIZER, **meta},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": INITIALIZER},
            "subjects": [{"kind": "ServiceAccount", "name": INITIALIZER, "namespace": namespace}],
        },
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": config_map, **meta},
            "data": {SCRIPT.name: script},
        },
        {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": f"{INITIALIZER}-{digest}", **meta},
            "spec": spec,
        },
        {
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": {"name": INITIALIZER, **meta},
            "spec": {
                "podSelector": {"matchLabels": _LABELS},
                "policyTypes": ["Ingress", "Egress"],
                "egress": [{"ports": [{"protocol": "TCP", "port": 443}]}],
            },
        },
    ]


class CheckpointKey(Construct):
    """Attributes: `manifest` (the initializer's objects; the trainer release depends on it)."""

    def __init__(self, scope: Construct, construct_id: str, *, cluster: eks.Cluster, namespace: str) -> None:
        super().__init__(scope, construct_id)
        self.manifest = cluster.add_manifest("Initializer", *initializer_manifests(namespace))
