"""One process kubelet per test module over the session's control plane (tests/conftest.py), and the
helpers its tests share."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
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


@pytest.fixture(scope="module")
def cluster(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Two GPU nodes (p5.48xlarge) and a system node run by one kubelet, in a namespace of the module's."""
    root: Path = tmp_path_factory.mktemp("nodes")
    suffix = uuid.uuid4().hex[:6]
    nodes = [gpu_node(f"gpu-{suffix}-0"), gpu_node(f"gpu-{suffix}-1"), system_node(f"system-{suffix}")]
    with ProcessKubelet(
        control_plane.kubeconfig, nodes, root, lease_renew_s=1.0, restart_backoff_s=0.5
    ) as kubelet:
        namespace = f"kubelet-{suffix}"
        cl = Cluster(control_plane, kubelet, namespace)
        cl.core.create_namespace({"metadata": {"name": namespace}})
        # The ServiceAccount admission plugin refuses pods until the namespace's default account exists.
        wait_for("the namespace's default service account", lambda: _has_default_account(cl), 60)
        yield cl
        cl.core.delete_namespace(namespace)
        for node in nodes:
            kubelet.api.delete_node(node.name)


def _has_default_account(cl: Cluster) -> bool:
    return any(
        sa.metadata.name == "default" for sa in cl.core.list_namespaced_service_account(cl.namespace).items
    )
