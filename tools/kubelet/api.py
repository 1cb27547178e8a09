"""The few API calls a kubelet makes, on plain dicts (the objects exactly as the API server serves them),
through the official `kubernetes` client."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

_NOT_FOUND = 404
_CONFLICT = 409


def api_client(kubeconfig: Path) -> client.ApiClient:
    return config.new_client_from_config(config_file=str(kubeconfig))


class KubeletApi:
    """Reads, status patches, deletes and watches for one kubelet."""

    def __init__(self, api: client.ApiClient) -> None:
        self.api = api
        self.core = client.CoreV1Api(api)
        self.coordination = client.CoordinationV1Api(api)

    # -- objects a pod needs --------------------------------------------------------------------
    def read(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """configmap, secret, persistentvolumeclaim, persistentvolume or pod as a dict; None if absent."""
        calls = {
            "configmap": lambda: self.core.read_namespaced_config_map(
                name, namespace, _preload_content=False
            ),
            "secret": lambda: self.core.read_namespaced_secret(name, namespace, _preload_content=False),
            "persistentvolumeclaim": lambda: self.core.read_namespaced_persistent_volume_claim(
                name, namespace, _preload_content=False
            ),
            "persistentvolume": lambda: self.core.read_persistent_volume(name, _preload_content=False),
            "pod": lambda: self.core.read_namespaced_pod(name, namespace, _preload_content=False),
        }
        try:
            return json.loads(calls[kind]().data)
        except ApiException as exc:
            if exc.status == _NOT_FOUND:
                return None
            raise

    def read_data(self, kind: str, namespace: str, name: str) -> Mapping[str, str] | None:
        import base64

        obj = self.read(kind, namespace, name)
        if obj is None:
            return None
        if kind == "secret":
            return {
                k: base64.b64decode(v).decode("utf-8", "replace") for k, v in (obj.get("data") or {}).items()
            }
        return dict(obj.get("data") or {})

    def issue_token(self, namespace: str, account: str, audience: str | None, seconds: int) -> str:
        spec: dict[str, Any] = {"expirationSeconds": max(600, seconds)}
        if audience:
            spec["audiences"] = [audience]
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
        return str(self.core.create_namespaced_service_account_token(account, namespace, body).status.token)

    # -- pods -----------------------------------------------------------------------------------
    def patch_pod_status(self, namespace: str, name: str, status: Mapping[str, Any]) -> bool:
        """Strategic-merge the status; False when the pod is gone."""
        try:
            self.core.patch_namespaced_pod_status(name, namespace, {"status": dict(status)})
            return True
        except ApiException as exc:
            if exc.status == _NOT_FOUND:
                return False
            raise

    def delete_pod_now(self, namespace: str, name: str, uid: str) -> None:
        """The kubelet's final delete of a pod it has stopped: grace 0, only this very pod (uid)."""
        body = client.V1DeleteOptions(grace_period_seconds=0, preconditions=client.V1Preconditions(uid=uid))
        try:
            self.core.delete_namespaced_pod(name, namespace, body=body)
        except ApiException as exc:
            if exc.status not in (_NOT_FOUND, _CONFLICT):
                raise

    def list_pods(self) -> tuple[list[dict[str, Any]], str]:
        raw = json.loads(self.core.list_pod_for_all_namespaces(_preload_content=False).data)
        return raw.get("items") or [], raw["metadata"]["resourceVersion"]

    def watch_pods(self, resource_version: str, timeout_s: int) -> Iterator[tuple[str, dict[str, Any]]]:
        """(event type, pod dict) from `resource_version` for at most `timeout_s`."""
        stream = watch.Watch().stream(
            self.core.list_pod_for_all_namespaces,
            resource_version=resource_version,
            timeout_seconds=timeout_s,
            allow_watch_bookmarks=False,
            _preload_content=False,
        )
        for event in stream:
            obj = event["raw_object"]
            yield event["type"], obj

    def record_event(
        self, pod: Mapping[str, Any], node: str, reason: str, message: str, kind: str = "Normal",
        field_path: str = "",
    ) -> None:  # fmt: skip
        """A kubelet event about `pod` (reason Started, Killing, BackOff, FailedMount as the kubelet
        names them); an event that cannot be written is dropped, as the kubelet's recorder drops it."""
        meta = pod["metadata"]
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {"kind": "Pod", "apiVersion": "v1", "name": meta["name"],
                               "namespace": meta["namespace"], "uid": meta["uid"],
                               **({"fieldPath": field_path} if field_path else {})},
            "reason": reason, "message": message, "type": kind, "count": 1,
            "firstTimestamp": now, "lastTimestamp": now,
            "source": {"component": "kubelet", "host": node}, "reportingComponent": "kubelet",
            "reportingInstance": node,
        }  # fmt: skip
        with contextlib.suppress(ApiException):
            self.core.create_namespaced_event(meta["namespace"], body)

    # -- nodes ----------------------------------------------------------------------------------
    def create_or_replace_node(self, node: Mapping[str, Any]) -> str:
        """Register the node (an old object of that name is deleted first: a fresh host); returns its uid."""
        name = node["metadata"]["name"]
        try:
            self.core.delete_node(name)
        except ApiException as exc:
            if exc.status != _NOT_FOUND:
                raise
        for _ in range(50):
            try:
                return str(self.core.create_node(dict(node)).metadata.uid)
            except ApiException as exc:
                if exc.status != _CONFLICT:  # the old object is still being deleted
                    raise
                import time

                time.sleep(0.1)
        raise RuntimeError(f"node {name}: an old Node object of that name is not going away")

    def patch_node_status(self, name: str, status: Mapping[str, Any]) -> None:
        self.core.patch_node_status(name, dict(status))

    def delete_node(self, name: str) -> None:
        try:
            self.core.delete_node(name)
        except ApiException as exc:
            if exc.status != _NOT_FOUND:
                raise

    def renew_lease(self, lease: Mapping[str, Any]) -> None:
        name = lease["metadata"]["name"]
        namespace = lease["metadata"]["namespace"]
        try:
            self.coordination.patch_namespaced_lease(name, namespace, {"spec": lease["spec"]})
        except ApiException as exc:
            if exc.status != _NOT_FOUND:
                raise
            self.coordination.create_namespaced_lease(namespace, dict(lease))
