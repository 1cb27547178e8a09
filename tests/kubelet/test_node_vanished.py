"""A node that vanishes (the cloud deleted its Node object, nothing reported): the real pod garbage
collector fails its pod with a DisruptionTarget condition and the real Job controller replaces it without
counting. Kubernetes' own pace (the pod GC's 40 s quarantine of a missing node): a soak test."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.clusterkit import Cluster, kubelet_cluster, wait_for
from tools.controlplane.launch import ControlPlane

pytestmark = pytest.mark.soak


@pytest.fixture(scope="module")
def cluster(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with kubelet_cluster(control_plane, tmp_path_factory.mktemp("nodes")) as cl:
        yield cl


def test_pod_gc_fails_a_vanished_node_s_pod_and_the_job_replaces_it(cluster: Cluster) -> None:
    job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": "vanish"},
        "spec": {
            "completionMode": "Indexed", "completions": 1, "parallelism": 1, "backoffLimit": 0,
            "podReplacementPolicy": "Failed",
            "podFailurePolicy": {"rules": [
                {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}]},
            "template": {"spec": {
                "restartPolicy": "Never", "terminationGracePeriodSeconds": 5,
                "nodeSelector": {"blueprint.nvrx/node-role": "gpu"},
                "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
                "containers": [{"name": "c", "image": "x", "command": ["sleep", "600"],
                                "resources": {"limits": {"nvidia.com/gpu": "8"}}}],
            }},
        },
    }  # fmt: skip
    cluster.batch.create_namespaced_job(cluster.namespace, job)

    def pods() -> list:
        return cluster.core.list_namespaced_pod(cluster.namespace, label_selector="job-name=vanish").items

    first = wait_for(
        "the pod running", lambda: next((p for p in pods() if p.status.phase == "Running"), None)
    )
    started = time.monotonic()
    cluster.kubelet.lose_node(first.spec.node_name, how="vanished")
    replacement = wait_for(
        "a replacement running",
        lambda: next(
            (p for p in pods() if p.metadata.uid != first.metadata.uid and p.status.phase == "Running"), None
        ),
        180,
    )
    took = time.monotonic() - started
    assert replacement.spec.node_name != first.spec.node_name
    assert (cluster.batch.read_namespaced_job("vanish", cluster.namespace).status.failed or 0) == 0
    print(f"replacement running {took:.0f} s after the node vanished")
