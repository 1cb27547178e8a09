"""The kubelet's env, command line and path mapping, without a cluster: $(VAR) expansion in order, the
downward API, cluster DNS names to 127.0.0.1, mountPaths to local folders in one pass."""

from __future__ import annotations

from pathlib import Path

import pytest

from tools.kubelet.env import (
    EnvError,
    cluster_name_pattern,
    container_argv,
    container_env,
    rewrite_cluster_names,
)
from tools.kubelet.sandbox import MountMap
from tools.kubelet.status import exit_code

POD = {
    "metadata": {"name": "job-0-abcde", "namespace": "team", "uid": "u1",
                 "annotations": {"batch.kubernetes.io/job-completion-index": "0"}},
    "spec": {"nodeName": "gpu-0", "hostname": "job-0", "subdomain": "job"},
}  # fmt: skip


def no_data(kind: str, namespace: str, name: str) -> None:
    return None


def test_env_in_order_with_downward_api_and_expansion() -> None:
    container = {
        "name": "c",
        "env": [
            {"name": "A", "value": "a"},
            {"name": "B", "value": "$(A)-$(LATER)-$$(A)"},  # LATER is not defined yet: kept as written
            {"name": "LATER", "value": "x"},
            {"name": "INDEX", "valueFrom": {"fieldRef": {
                "fieldPath": "metadata.annotations['batch.kubernetes.io/job-completion-index']"}}},
            {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {"name": "OPT", "valueFrom": {"configMapKeyRef": {"name": "none", "key": "k", "optional": True}}},
        ],
        "command": ["run", "$(B)", "$(INDEX)", "$$(NODE)", "$(NODE)"],
    }  # fmt: skip
    env = container_env(POD, container, read_data=no_data, host_ip="127.0.0.1", pod_ip="127.0.0.1")
    assert env["B"] == "a-$(LATER)-$(A)"
    assert (env["INDEX"], env["NODE"], env["HOSTNAME"]) == ("0", "gpu-0", "job-0")
    assert "OPT" not in env
    assert container_argv(container, env) == ["run", "a-$(LATER)-$(A)", "0", "$(NODE)", "gpu-0"]


def test_a_missing_required_key_is_an_error() -> None:
    container = {
        "name": "c",
        "env": [{"name": "K", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}],
    }
    with pytest.raises(EnvError, match="secret 's' has no key 'k'"):
        container_env(POD, container, read_data=no_data, host_ip="", pod_ip="")


def test_cluster_names_become_loopback() -> None:
    names = cluster_name_pattern("cluster.local")
    assert rewrite_cluster_names("trainer-rdzv.team.svc.cluster.local:29400", names) == "127.0.0.1:29400"
    assert rewrite_cluster_names("--ep=job-0.job.team.svc.cluster.local.", names) == "--ep=127.0.0.1"
    assert (
        rewrite_cluster_names("example.com:80 svc.cluster.localx", names)
        == "example.com:80 svc.cluster.localx"
    )


def test_mount_paths_map_to_local_folders_once() -> None:
    mounts = MountMap.of([("/fsx", Path("/tmp/n/fsx")), ("/tmp", Path("/tmp/n/scratch")),
                          ("/dev/shm", Path("/tmp/n/shm"))])  # fmt: skip
    # /tmp/n/fsx lies under the /tmp mount: a path put in is not rewritten again.
    assert mounts.rewrite("--data-path=/fsx/data/t.npy") == "--data-path=/tmp/n/fsx/data/t.npy"
    assert mounts.rewrite("/tmp") == "/tmp/n/scratch"
    assert mounts.rewrite("a /tmp/b:/fsx") == "a /tmp/n/scratch/b:/tmp/n/fsx"
    assert mounts.rewrite("/fsxy/a /var/fsx") == "/fsxy/a /var/fsx"  # only whole mountPaths at a path start
    assert mounts.rewrite("--snapshot-dir=/dev/shm/s") == "--snapshot-dir=/tmp/n/shm/s"


def test_exit_codes_as_containerd_reports_them() -> None:
    assert (exit_code(0), exit_code(3), exit_code(-9), exit_code(-15)) == (0, 3, 137, 143)
