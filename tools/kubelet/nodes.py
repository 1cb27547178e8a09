"""The Nodes a process kubelet registers: one per simulated host, with the labels, taints and
allocatable resources the chart's nodeSelector and tolerations expect, kept Ready by heartbeats.

A GPU node carries what an EKS GPU node group's node carries for the chart (k8s/values.yaml
`nodeSelector`, `tolerations`; k8s/instance-types.json): `node.kubernetes.io/instance-type`, the node
group's `blueprint.nvrx/node-role: gpu` label, the `nvidia.com/gpu=true:NoSchedule` taint, and the
extended resources the NVIDIA and EFA device plugins advertise (`nvidia.com/gpu`,
`vpc.amazonaws.com/efa`). A system node has no taint and no devices: the rendezvous service and the
chart's helper pods land there.

Heartbeats are what a kubelet sends: the Node's Lease in kube-node-lease renewed every
`lease_renew_s`, and the Node's status (Ready and the pressure conditions) posted every
`status_update_s`. A lost node sends neither: the real node lifecycle controller then marks it NotReady
after its grace period.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
INSTANCE_TYPES = REPO / "k8s" / "instance-types.json"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "true", "effect": "NoSchedule"}
GPU_ROLE_LABEL = ("blueprint.nvrx/node-role", "gpu")
KUBELET_VERSION = "v1.35.4"
LEASE_DURATION_S = 40  # the kubelet's default


@dataclass(frozen=True)
class NodeSpec:
    """One simulated host: its name, labels, taints and capacity (allocatable = capacity)."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Mapping[str, str], ...] = ()
    capacity: Mapping[str, str] = field(default_factory=dict)
    host_dirs: tuple[str, ...] = ()
    """hostPath folders that exist on the node when it registers (an instance's NVMe mount)."""

    def __post_init__(self) -> None:
        if not self.name or len(self.name) > 63:
            raise ValueError(f"node name {self.name!r}: 1-63 characters")


def instance_facts(instance_type: str) -> Mapping[str, int]:
    types = json.loads(INSTANCE_TYPES.read_text())["types"]
    if instance_type not in types:
        raise ValueError(
            f"instance type {instance_type!r}: not in {INSTANCE_TYPES.name} ({', '.join(types)})"
        )
    return types[instance_type]


def gpu_node(
    name: str,
    instance_type: str = "p5.48xlarge",
    *,
    zone: str = "us-west-2a",
    extra_labels: Mapping[str, str] | None = None,
    host_dirs: tuple[str, ...] = (),
    cpu: str = "192",
    memory: str = "2048Gi",
    gpus: int | None = None,
) -> NodeSpec:
    """A node of the GPU node group: its instance type's GPUs and EFA interfaces as extended resources.
    `gpus` overrides the instance type's count (a CPU-sized run whose pods ask for fewer GPUs than the
    instance has still gets one pod per node, as a pod taking all of them does on the real group)."""
    facts = dict(instance_facts(instance_type))
    if gpus is not None:
        facts["gpus"] = gpus
    return NodeSpec(
        name=name,
        labels={
            "node.kubernetes.io/instance-type": instance_type,
            GPU_ROLE_LABEL[0]: GPU_ROLE_LABEL[1],
            "topology.kubernetes.io/zone": zone,
            **(extra_labels or {}),
        },
        taints=(GPU_TAINT,),
        capacity={
            "cpu": cpu,
            "memory": memory,
            "pods": "110",
            "ephemeral-storage": "1000Gi",
            "nvidia.com/gpu": str(facts["gpus"]),
            "vpc.amazonaws.com/efa": str(facts["efaInterfaces"]),
            "hugepages-2Mi": "10Gi",
        },
        host_dirs=host_dirs,
    )


def system_node(name: str, *, zone: str = "us-west-2a") -> NodeSpec:
    """A node of the system node group: no taint, no devices."""
    return NodeSpec(
        name=name,
        labels={"node.kubernetes.io/instance-type": "m6i.2xlarge", "topology.kubernetes.io/zone": zone},
        capacity={"cpu": "8", "memory": "32Gi", "pods": "110", "ephemeral-storage": "100Gi"},
    )


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def now_micro() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def node_object(spec: NodeSpec) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": spec.name,
            "labels": {
                "kubernetes.io/hostname": spec.name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                **spec.labels,
            },
        },
        "spec": {"taints": [dict(t) for t in spec.taints]},
    }


def node_status(spec: NodeSpec, kubelet_port: int, ready: bool = True) -> dict[str, Any]:
    """The status a kubelet posts. One address, InternalIP 127.0.0.1: the API server reaches the node's
    kubelet endpoint (pod logs) there; a Hostname address would be preferred and would not resolve."""
    now = now_iso()

    def condition(kind: str, status: str, reason: str, message: str) -> dict[str, str]:
        return {"type": kind, "status": status, "reason": reason, "message": message,
                "lastHeartbeatTime": now, "lastTransitionTime": now}  # fmt: skip

    return {
        "status": {
            "capacity": dict(spec.capacity),
            "allocatable": dict(spec.capacity),
            "conditions": [
                condition("Ready", "True", "KubeletReady", "process kubelet is posting ready status")
                if ready
                else condition("Ready", "False", "KubeletNotReady", "node is shutting down"),
                condition("MemoryPressure", "False", "KubeletHasSufficientMemory", "no memory pressure"),
                condition("DiskPressure", "False", "KubeletHasNoDiskPressure", "no disk pressure"),
                condition("PIDPressure", "False", "KubeletHasSufficientPID", "no PID pressure"),
            ],
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": kubelet_port}},
            "nodeInfo": {
                "machineID": uuid.uuid5(uuid.NAMESPACE_DNS, spec.name).hex,
                "systemUUID": str(uuid.uuid5(uuid.NAMESPACE_DNS, spec.name)),
                "bootID": str(uuid.uuid4()),
                "kernelVersion": "process",
                "osImage": "process kubelet (tools/kubelet)",
                "containerRuntimeVersion": "process://1",
                "kubeletVersion": KUBELET_VERSION,
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        }
    }


def lease_object(node: str) -> dict[str, Any]:
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": node, "namespace": "kube-node-lease"},
        "spec": {"holderIdentity": node, "leaseDurationSeconds": LEASE_DURATION_S, "renewTime": now_micro()},
    }
