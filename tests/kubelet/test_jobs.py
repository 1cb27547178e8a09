"""Jobs through the real Job controller, their pods run by the process kubelet: an Indexed Job completes,
and a pod of a lost node is replaced under a podFailurePolicy without counting against the backoff."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kubernetes import client

from tests.clusterkit import Cluster, wait_for

GPU_POD = {
    # What the chart's trainer pods ask for (k8s/values.yaml): the GPU node group and all of its GPUs, so
    # one pod per node.
    "nodeSelector": {"node.kubernetes.io/instance-type": "p5.48xlarge", "blueprint.nvrx/node-role": "gpu"},
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Equal", "value": "true", "effect": "NoSchedule"}],
}
GPU_RESOURCES = {"requests": {"nvidia.com/gpu": "8"}, "limits": {"nvidia.com/gpu": "8"}}


def job(name: str, script: str, *, completions: int, extra_spec: dict[str, Any] | None = None,
        env: list[dict[str, Any]] | None = None) -> dict[str, Any]:  # fmt: skip
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "completionMode": "Indexed",
            "completions": completions,
            "parallelism": completions,
            "backoffLimit": 0,
            **(extra_spec or {}),
            "template": {
                "spec": {
                    "restartPolicy": "Never",
                    "terminationGracePeriodSeconds": 5,
                    **GPU_POD,
                    "containers": [
                        {"name": "main", "image": "x", "command": ["sh", "-c", script],
                         "env": env or [], "resources": GPU_RESOURCES}
                    ],
                }
            },
        },
    }  # fmt: skip


def job_condition(cluster: Cluster, name: str) -> str | None:
    status = cluster.batch.read_namespaced_job(name, cluster.namespace).status
    for condition in status.conditions or []:
        if condition.status == "True" and condition.type in ("Complete", "Failed"):
            return str(condition.type)
    return None


def pods_of(cluster: Cluster, job_name: str) -> list[Any]:
    return cluster.core.list_namespaced_pod(cluster.namespace, label_selector=f"job-name={job_name}").items


def test_indexed_job_completes_through_the_job_controller(cluster: Cluster, tmp_path: Path) -> None:
    # Each pod waits (up to 30 s) until both have started: two 8-GPU pods running at once must be on two
    # nodes. (The process kubelet's pods share this machine's files, so a folder is their meeting point;
    # without the wait a quick first pod could end before the second was scheduled, on the same node.)
    met = tmp_path / "started"
    met.mkdir()
    script = (
        f"touch {met}/$JOB_COMPLETION_INDEX; for _ in $(seq 300); do "
        f'[ "$(ls {met} | wc -l)" -ge 2 ] && break; sleep 0.1; done; echo "index $JOB_COMPLETION_INDEX"'
    )
    cluster.batch.create_namespaced_job(cluster.namespace, job("indexed", script, completions=2))
    assert wait_for("the Job's end", lambda: job_condition(cluster, "indexed"), 90) == "Complete"
    pods = pods_of(cluster, "indexed")
    by_index = {p.metadata.annotations["batch.kubernetes.io/job-completion-index"]: p for p in pods}
    assert sorted(by_index) == ["0", "1"]
    for index, pod in by_index.items():
        assert pod.status.phase == "Succeeded"
        assert cluster.log(pod.metadata.name).strip() == f"index {index}"
    # One pod per GPU node: each took all 8 GPUs of its node.
    assert len({p.spec.node_name for p in pods}) == 2


def test_lost_node_pod_is_replaced_without_counting_under_pod_failure_policy(cluster: Cluster) -> None:
    # The first pod waits; its replacement finds FINISH (a ConfigMap made after the first pod started) and
    # exits 0. backoffLimit 0: a counted failure would fail the Job.
    script = (
        'if [ -n "$FINISH" ]; then echo "replacement on $NODE"; exit 0; fi; echo "first on $NODE"; sleep 600'
    )
    env = [
        {
            "name": "FINISH",
            "valueFrom": {"configMapKeyRef": {"name": "finish", "key": "now", "optional": True}},
        },
        {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
    ]
    policy = {
        "podReplacementPolicy": "Failed",
        "podFailurePolicy": {
            "rules": [
                {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
            ]
        },
    }
    cluster.batch.create_namespaced_job(
        cluster.namespace, job("lossy", script, completions=1, extra_spec=policy, env=env)
    )
    first = wait_for(
        "the first pod running",
        lambda: next((p for p in pods_of(cluster, "lossy") if p.status.phase == "Running"), None),
        60,
    )
    lost_node = first.spec.node_name
    wait_for("the first pod's line", lambda: cluster.log(first.metadata.name).startswith("first"), 20)
    cluster.core.create_namespaced_config_map(
        cluster.namespace, {"metadata": {"name": "finish"}, "data": {"now": "1"}}
    )
    killed = cluster.kubelet.lose_node(lost_node)
    assert killed, "the lost node's pod had processes to kill"
    assert wait_for("the Job's end", lambda: job_condition(cluster, "lossy"), 90) == "Complete"
    pods = {p.metadata.name: p for p in pods_of(cluster, "lossy")}
    lost = pods[first.metadata.name]
    assert lost.status.phase == "Failed"
    assert {c.type: (c.status, c.reason) for c in lost.status.conditions}["DisruptionTarget"] == (
        "True",
        "TerminationByKubelet",
    )
    replacement = next(p for name, p in pods.items() if name != first.metadata.name)
    assert replacement.status.phase == "Succeeded" and replacement.spec.node_name != lost_node
    assert cluster.log(replacement.metadata.name).strip() == f"replacement on {replacement.spec.node_name}"
    status = cluster.batch.read_namespaced_job("lossy", cluster.namespace).status
    assert (status.succeeded, status.failed or 0) == (1, 0)  # the lost pod did not count
    node = cluster.core.read_node(lost_node)
    assert {c.type: c.status for c in node.status.conditions}["Ready"] == "False"


def test_a_vanished_node_is_deleted_and_its_lease_collected(cluster: Cluster) -> None:
    # The cloud's way (an instance terminated): nothing reported, the Node object deleted; its Lease, owned
    # by the Node, goes with it through the real garbage collector.
    node = next(n for n in sorted(cluster.kubelet.nodes) if n.startswith("system-"))
    cluster.kubelet.lose_node(node, how="vanished")
    names = lambda: {n.metadata.name for n in cluster.core.list_node().items}  # noqa: E731
    wait_for("the Node object deleted", lambda: node not in names(), 20)
    leases = client.CoordinationV1Api(cluster.api)
    wait_for(
        "its Lease collected",
        lambda: node not in {x.metadata.name for x in leases.list_namespaced_lease("kube-node-lease").items},
        60,
    )
