"""What the control-plane tests share: an API client for the session's control plane, a namespace per
test, and polling with a deadline."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from tools.controlplane.launch import ControlPlane

T = TypeVar("T")
DEADLINE_S = 60.0
"""Controllers act within a second or two; the margin is for a loaded 2-core machine."""


def api_client(plane: ControlPlane) -> client.ApiClient:
    """A client configured from the admin kubeconfig, as a user's tools would be."""
    return config.new_client_from_config(config_file=str(plane.kubeconfig))


def eventually(read: Callable[[], T | None], what: str, timeout_s: float = DEADLINE_S) -> T:
    """Poll `read` until it returns something truthy; fail naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = read()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout_s:.0f} s: {what}")
        time.sleep(0.2)


@contextmanager
def namespace(api: client.ApiClient, prefix: str) -> Iterator[str]:
    """A fresh namespace with its default service account (pods are refused until the service-account
    controller has made it), deleted afterwards without waiting."""
    core = client.CoreV1Api(api)
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    eventually(lambda: _exists(lambda: core.read_namespaced_service_account("default", name)), "default SA")
    try:
        yield name
    finally:
        core.delete_namespace(name)


def _exists(read: Callable[[], object]) -> bool:
    try:
        read()
    except ApiException as error:
        if error.status == 404:
            return False
        raise
    return True
