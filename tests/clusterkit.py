"""Tests on the real control plane (the session's `control_plane` fixture, tests/conftest.py) with a
process kubelet (tools/kubelet) under it: `kubelet_cluster` starts one (two GPU nodes and a system node)
for a test module, `Cluster` is what the tests call, `wait_for` polls. A module makes its fixture with

    @pytest.fixture(scope="module")
    def cluster(control_plane, tmp_path_factory):
        with kubelet_cluster(control_plane, tmp_path_factory.mktemp("nodes")) as cl:
            yield cl
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from kubernetes import client, config

from tools.controlplane.launch import ControlPlane
from tools.kubelet.kubelet import ProcessKubelet
from tools.kubelet.nodes import gpu_node, system_node

T = TypeVar("T")


def wait_for(what: str, probe: Callable[[], T | None], timeout_s: float = 60.0, every_s: float = 0.2) -> T:
    """Poll `probe` until it returns something truthy; fail naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    last: T | None = None
    while time.monotonic() < deadline:
        last = probe()
        if last:
            return last
        time.sleep(every_s)
    raise AssertionError(f"{what}: not after {timeout_s:.0f} s (last: {last!r})")


class Cluster:
    """The API as the tests use it: a namespace of their own, pods and Jobs."""

    def __init__(self, plane: ControlPlane, kubelet: ProcessKubelet, namespace: str) -> None:
        self.plane = plane
        self.kubelet = kubelet
        self.namespace = namespace
        self.api = config.new_client_from_config(str(plane.kubeconfig))
        self.core = client.CoreV1Api(self.api)
        self.batch = client.BatchV1Api(self.api)

    def new_namespace(self, namespace: str) -> None:
        """Create `namespace` and wait for its default service account (the ServiceAccount admission
        plugin refuses pods until the controller manager has made it)."""
        self.core.create_namespace({"metadata": {"name": namespace}})

        def has_account() -> bool:
            accounts = self.core.list_namespaced_service_account(namespace).items
            return any(sa.metadata.name == "default" for sa in accounts)

        wait_for(f"the default service account of {namespace}", has_account, 60)

    def pod(self, name: str) -> client.V1Pod | None:
        try:
            return self.core.read_namespaced_pod(name, self.namespace)
        except client.exceptions.ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def create_pod(self, name: str, containers: list[dict[str, Any]], **spec: Any) -> None:
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {"containers": containers, "terminationGracePeriodSeconds": 5, **spec},
        }
        self.core.create_namespaced_pod(self.namespace, body)

    def wait_phase(self, name: str, phases: tuple[str, ...], timeout_s: float = 60.0) -> client.V1Pod:
        def done() -> client.V1Pod | None:
            pod = self.pod(name)
            return pod if pod is not None and pod.status.phase in phases else None

        return wait_for(f"pod {name} in {phases}", done, timeout_s)

    def log(self, name: str, container: str | None = None, previous: bool = False) -> str:
        return str(
            self.core.read_namespaced_pod_log(name, self.namespace, container=container, previous=previous)
        )


@contextmanager
def kubelet_cluster(plane: ControlPlane, root: Path) -> Iterator[Cluster]:
    """Two GPU nodes (p5.48xlarge) and a system node run by one kubelet, and a namespace of their own;
    the namespace and the nodes are deleted at the end."""
    _no_pods_waiting_for_gpu_nodes(plane)
    suffix = uuid.uuid4().hex[:6]
    nodes = [gpu_node(f"gpu-{suffix}-0"), gpu_node(f"gpu-{suffix}-1"), system_node(f"system-{suffix}")]
    with ProcessKubelet(plane.kubeconfig, nodes, root, lease_renew_s=1.0, restart_backoff_s=0.5) as kubelet:
        cl = Cluster(plane, kubelet, f"kubelet-{suffix}")
        cl.new_namespace(cl.namespace)
        yield cl
        cl.core.delete_namespace(cl.namespace)
        for node in nodes:
            kubelet.api.delete_node(node.name)


def _no_pods_waiting_for_gpu_nodes(plane: ControlPlane, timeout_s: float = 60.0) -> None:
    """Wait until no pod of another test waits for a GPU node (a trainer pod another module's helm
    install left Pending, its namespace being deleted): this kubelet's nodes would take it and run it."""
    core = client.CoreV1Api(config.new_client_from_config(str(plane.kubeconfig)))

    def waiting() -> list[str]:
        pods = core.list_pod_for_all_namespaces(field_selector="spec.nodeName=").items
        return [
            f"{p.metadata.namespace}/{p.metadata.name}"
            for p in pods
            if (p.spec.node_selector or {}).get("blueprint.nvrx/node-role") == "gpu"
        ]

    deadline = time.monotonic() + timeout_s
    while (left := waiting()) and time.monotonic() < deadline:
        time.sleep(0.5)
    if left:
        raise AssertionError(
            f"pods of other tests wait for GPU nodes and would run on this kubelet's: {left}"
        )
