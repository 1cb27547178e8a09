"""`ProcessKubelet`: the node agents of several simulated hosts in one process, against a real API server.

    with ProcessKubelet(kubeconfig, [gpu_node("gpu-0"), gpu_node("gpu-1"), system_node("system-0")],
                        root=tmp / "nodes") as kubelet:
        ...                                 # the scheduler binds pods; the kubelet runs them
        kubelet.lose_node("gpu-0")          # the host vanishes: its pods' processes die at once

It registers each Node, keeps it Ready (Lease renewals and status posts), watches every pod bound to one
of its nodes (spec.nodeName) and runs it in a PodWorker (tools/kubelet/podworker.py), serves container
logs to the API server (tools/kubelet/logserver.py), and on exit kills every process it started.

A lost node (`lose_node`): every process of its pods is SIGKILLed at once, its heartbeats stop (the
real node lifecycle controller marks it NotReady after its grace period), and then, by `how`:
- `"terminated"` (the default): what EKS's node termination handling amounts to, done at once: each of
  the node's pods is reported Failed with a `DisruptionTarget` condition (reason TerminationByKubelet, as
  the kubelet's node shutdown manager writes), so the real Job controller's podFailurePolicy `Ignore` rule
  replaces it without counting it, within a second;
- `"vanished"`: nothing is reported and the Node object is deleted, as the cloud node controller does
  when the instance is gone: the real pod garbage collector then marks its pods Failed (DisruptionTarget,
  DeletionByPodGC) and deletes them, after its 40 s quarantine of a missing node (a replacement ran
  67 s after the loss): Kubernetes' own path, at Kubernetes' own pace.
A lost node stays lost (its name is not registered again by this kubelet).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kubernetes.client.exceptions import ApiException

from tools.kubelet.api import KubeletApi, api_client
from tools.kubelet.env import cluster_name_pattern
from tools.kubelet.image import REPO, image_env
from tools.kubelet.logserver import LogServer
from tools.kubelet.nodes import NodeSpec, lease_object, node_object, node_status
from tools.kubelet.podworker import NodeContext, PodWorker, disruption_condition

log = logging.getLogger("tools.kubelet")
WATCH_WINDOW_S = 5  # a watch request lasts this long: stop() waits for the last one to end
NOT_READY_TAINT = "node.kubernetes.io/not-ready"
TAINT_WAIT_S = 10.0
_GONE = 410


class ProcessKubelet:
    """Node agents for `nodes`, their folders under `root`, PVC volumes under `storage_root`."""

    def __init__(
        self,
        kubeconfig: Path,
        nodes: Sequence[NodeSpec],
        root: Path,
        *,
        storage_root: Path | None = None,
        cluster_domain: str = "cluster.local",
        lease_renew_s: float = 2.0,
        status_update_s: float = 10.0,
        restart_backoff_s: float = 10.0,
    ) -> None:
        if len({n.name for n in nodes}) != len(nodes):
            raise ValueError("nodes: every node needs a name of its own")
        self.api = KubeletApi(api_client(kubeconfig))
        self._watch_api = KubeletApi(api_client(kubeconfig))  # its own connections: a watch holds one
        self.nodes = {n.name: n for n in nodes}
        self.root = root
        self.storage_root = storage_root or root / "storage"
        self._names = cluster_name_pattern(cluster_domain)
        self._lease_renew_s = lease_renew_s
        self._status_update_s = status_update_s
        self._restart_backoff_s = restart_backoff_s
        self._workers: dict[str, PodWorker] = {}
        self._lost: set[str] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._logs = LogServer(self._log_lookup, root / "pki")
        self._env = image_env()

    # -- lifecycle -------------------------------------------------------------------------------
    def __enter__(self) -> ProcessKubelet:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        self._logs.__enter__()
        for spec in self.nodes.values():
            node_root = self.node_root(spec.name)
            for folder in spec.host_dirs:
                (node_root / "host" / folder.lstrip("/")).mkdir(parents=True, exist_ok=True)
            uid = self.api.create_or_replace_node(node_object(spec))
            self.api.patch_node_status(spec.name, node_status(spec, self._logs.port))
            lease = lease_object(spec.name)
            lease["metadata"]["ownerReferences"] = [
                {"apiVersion": "v1", "kind": "Node", "name": spec.name, "uid": uid}
            ]
            self.api.renew_lease(lease)
        for target, name in ((self._heartbeats, "kubelet-heartbeats"), (self._watch_pods, "kubelet-pods")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        """Kill every pod's processes (no status posted: the kubelet is going away) and stop."""
        self._stop.set()
        with self._lock:
            workers = list(self._workers.values())
        for worker in workers:
            worker.lose()
        for worker in workers:
            worker.join(timeout=10)
        self._logs.__exit__(None, None, None)
        for thread in self._threads:
            thread.join(timeout=WATCH_WINDOW_S + 5)

    def node_root(self, node: str) -> Path:
        return self.root / node

    # -- faults ----------------------------------------------------------------------------------
    def lose_node(self, node: str, how: str = "terminated") -> set[int]:
        """Lose `node` (see the module doc for `how`); returns the PIDs killed."""
        if node not in self.nodes:
            raise KeyError(f"node {node!r} is not one of this kubelet's")
        if how not in ("terminated", "vanished"):
            raise ValueError(f"how: 'terminated' or 'vanished', not {how!r}")
        with self._lock:
            self._lost.add(node)
            workers = [w for w in self._workers.values() if w.ctx.node == node and not w.finished.is_set()]
        killed: set[int] = set()
        for worker in workers:
            killed |= worker.lose()
        for worker in workers:
            worker.join(timeout=10)
        if how == "terminated":
            # The node's last word, as the kubelet's shutdown manager posts it: NotReady. Its pods are
            # reported Failed only once the node lifecycle controller has tainted it not-ready, so the
            # scheduler cannot bind their replacements to this lost node.
            self.api.patch_node_status(node, node_status(self.nodes[node], self._logs.port, ready=False))
            self._wait_tainted(node, NOT_READY_TAINT, TAINT_WAIT_S)
            for worker in workers:
                worker.report_lost(disruption_condition(node))
        if how == "vanished":
            self.api.delete_node(node)
        return killed

    def _wait_tainted(self, node: str, key: str, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            taints = self.api.core.read_node(node).spec.taints or []
            if any(t.key == key for t in taints):
                return
            time.sleep(0.1)
        log.warning("node %s: no %s taint after %.0f s", node, key, timeout_s)

    def pods_on(self, node: str) -> list[str]:
        """`namespace/name` of the pods this kubelet runs on `node` now."""
        with self._lock:
            return sorted(
                f"{w.namespace}/{w.pod_name}"
                for w in self._workers.values()
                if w.ctx.node == node and w.is_alive()
            )

    # -- heartbeats ------------------------------------------------------------------------------
    def _heartbeats(self) -> None:
        since_status = 0.0
        while not self._stop.wait(self._lease_renew_s):
            since_status += self._lease_renew_s
            for name, spec in self.nodes.items():
                if name in self._lost:
                    continue
                try:
                    self.api.renew_lease(lease_object(name))
                    if since_status >= self._status_update_s:
                        self.api.patch_node_status(name, node_status(spec, self._logs.port))
                except ApiException as exc:  # the API server may be restarting: the next beat retries
                    log.warning("node %s: heartbeat failed: %s", name, exc.reason)
            if since_status >= self._status_update_s:
                since_status = 0.0

    # -- pods ------------------------------------------------------------------------------------
    def _watch_pods(self) -> None:
        resource_version = ""
        while not self._stop.is_set():
            try:
                if not resource_version:
                    items, resource_version = self._watch_api.list_pods()
                    for pod in items:
                        self._dispatch("MODIFIED", pod)
                for kind, pod in self._watch_api.watch_pods(resource_version, WATCH_WINDOW_S):
                    if self._stop.is_set():
                        return
                    if kind == "ERROR":
                        resource_version = ""
                        break
                    resource_version = pod["metadata"]["resourceVersion"]
                    self._dispatch(kind, pod)
            except ApiException as exc:
                if exc.status == _GONE:
                    resource_version = ""
                elif not self._stop.is_set():
                    log.warning("pod watch failed (%s); watching again", exc.reason)
                    self._stop.wait(1.0)
            except Exception as exc:  # a dropped connection: list and watch again
                if not self._stop.is_set():
                    log.warning("pod watch failed (%s); listing again", exc)
                    resource_version = ""
                    self._stop.wait(1.0)

    def _dispatch(self, kind: str, pod: dict[str, Any]) -> None:
        node = (pod.get("spec") or {}).get("nodeName")
        if node not in self.nodes or node in self._lost:
            return
        uid = pod["metadata"]["uid"]
        with self._lock:
            if self._stop.is_set():
                return
            worker = self._workers.get(uid)
            if kind == "DELETED":
                if worker is not None:
                    worker.gone()
                return
            if worker is None:
                phase = (pod.get("status") or {}).get("phase")
                if phase in ("Succeeded", "Failed"):
                    # A pod that ended before this kubelet saw it (another run's): only confirm a deletion.
                    if pod["metadata"].get("deletionTimestamp"):
                        self.api.delete_pod_now(pod["metadata"]["namespace"], pod["metadata"]["name"], uid)
                    return
                worker = PodWorker(pod, self._context(node))
                self._workers[uid] = worker
                worker.start()
            elif worker.finished.is_set():
                if pod["metadata"].get("deletionTimestamp"):
                    self.api.delete_pod_now(pod["metadata"]["namespace"], pod["metadata"]["name"], uid)
                return
            worker.update(pod)

    def _context(self, node: str) -> NodeContext:
        return NodeContext(
            api=self.api,
            node=node,
            node_root=self.node_root(node),
            storage_root=self.storage_root,
            image_env=self._env,
            workdir=REPO,
            cluster_names=self._names,
            restart_backoff_s=self._restart_backoff_s,
        )

    def _log_lookup(self, namespace: str, pod: str, container: str, previous: bool) -> Any:
        with self._lock:
            # The newest pod of that name: a name can be reused once the older pod is gone.
            worker = next(
                (
                    w
                    for w in reversed(self._workers.values())
                    if w.namespace == namespace and w.pod_name == pod
                ),
                None,
            )
        if worker is None:
            return None, lambda: False
        return worker.log_file(container, previous), lambda: worker.container_running(container)
