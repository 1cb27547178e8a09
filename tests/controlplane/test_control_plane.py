"""The real control plane (tools/controlplane) on this machine: the API server answers with the pinned
version and the EKS admission plugins, the real controllers act (Deployment -> ReplicaSet -> pods, an
Indexed Job's pods, a namespace's deletion), and a start or stop leaves no process and no port behind."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from kubernetes import client

from tests.controlplane.helpers import api_client, eventually, namespace
from tests.helpers import REPO_ROOT
from tools.controlplane.launch import ControlPlane, ControlPlaneError, binaries, running_control_plane
from tools.controlplane.processes import https_get

LABELS = {"app": "probe"}
CONTAINER = client.V1Container(name="main", image="registry.invalid/probe:1", command=["true"])


NO_NODE = {"blueprint.test/no-such-node": "true"}
"""A node selector no node matches: the pods stay Pending even where a process kubelet has registered
nodes on the session's control plane."""


def _template() -> client.V1PodTemplateSpec:
    return client.V1PodTemplateSpec(
        metadata=client.V1ObjectMeta(labels=LABELS),
        spec=client.V1PodSpec(containers=[CONTAINER], node_selector=NO_NODE),
    )


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return state[state.rindex(")") + 2] != "Z"


def _processes_mentioning(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if text in cmdline and _alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def _bindable(port: int) -> bool:
    """Whether a server could listen on the port now. SO_REUSEADDR, as every server sets (Go's listeners
    too): the closed connections of a stopped server linger in TIME_WAIT, which holds no port for it."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
            sock.listen()
        except OSError:
            return False
    return True


def test_the_api_server_answers_with_the_pinned_version(control_plane: ControlPlane) -> None:
    api = api_client(control_plane)
    version = client.VersionApi(api).get_code()
    assert (version.major, version.minor) == ("1", "35"), version
    assert version.git_version.startswith("v1.35."), version.git_version
    assert (
        https_get(control_plane.server + "/readyz", ca_file=control_plane.ca_file, token=control_plane.token)
        == 200
    )
    # The CA file really is what the server's certificate chains to, and anonymous callers get nothing more.
    assert https_get(control_plane.server + "/api/v1/namespaces", ca_file=control_plane.ca_file) in (401, 403)
    startup = json.loads((control_plane.workdir / "startup.json").read_text())
    assert set(startup["pids"]) == {"etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler"}


def test_the_system_priority_classes_exist_and_admission_defaults_pods(control_plane: ControlPlane) -> None:
    api = api_client(control_plane)
    classes = {pc.metadata.name for pc in client.SchedulingV1Api(api).list_priority_class().items}
    assert {"system-node-critical", "system-cluster-critical"} <= classes
    with namespace(api, "admission") as ns:
        pod = client.CoreV1Api(api).create_namespaced_pod(
            ns,
            client.V1Pod(
                metadata=client.V1ObjectMeta(name="p"), spec=client.V1PodSpec(containers=[CONTAINER])
            ),
        )
        # ServiceAccount admission mounted the token volume; DefaultTolerationSeconds added the 300 s
        # not-ready/unreachable tolerations: both plugins are on.
        assert pod.spec.service_account_name == "default"
        assert any(v.name.startswith("kube-api-access-") for v in pod.spec.volumes)
        tolerations = {(t.key, t.toleration_seconds) for t in pod.spec.tolerations}
        assert ("node.kubernetes.io/not-ready", 300) in tolerations
        assert ("node.kubernetes.io/unreachable", 300) in tolerations


def test_the_real_controllers_create_pods_for_a_deployment_and_an_indexed_job(
    control_plane: ControlPlane,
) -> None:
    api = api_client(control_plane)
    core, apps, batch = client.CoreV1Api(api), client.AppsV1Api(api), client.BatchV1Api(api)
    with namespace(api, "controllers") as ns:
        apps.create_namespaced_deployment(
            ns,
            client.V1Deployment(
                metadata=client.V1ObjectMeta(name="web"),
                spec=client.V1DeploymentSpec(
                    replicas=2, selector=client.V1LabelSelector(match_labels=LABELS), template=_template()
                ),
            ),
        )
        pods = eventually(
            lambda: [p for p in core.list_namespaced_pod(ns, label_selector="app=probe").items] or None,
            "the Deployment's pods",
        )
        eventually(lambda: len(core.list_namespaced_pod(ns, label_selector="app=probe").items) == 2, "2 pods")
        (owner,) = pods[0].metadata.owner_references
        assert owner.kind == "ReplicaSet" and owner.controller
        (rs_owner,) = apps.read_namespaced_replica_set(owner.name, ns).metadata.owner_references
        assert (rs_owner.kind, rs_owner.name) == ("Deployment", "web")
        # The scheduler finds no node for them, and says so on the pod.
        eventually(
            lambda: any(
                c.type == "PodScheduled" and c.reason == "Unschedulable"
                for c in (core.read_namespaced_pod(pods[0].metadata.name, ns).status.conditions or [])
            ),
            "the scheduler's Unschedulable condition",
        )

        template = _template()
        template.spec.restart_policy = "Never"
        template.metadata.labels = {"app": "indexed"}
        batch.create_namespaced_job(
            ns,
            client.V1Job(
                metadata=client.V1ObjectMeta(name="train"),
                spec=client.V1JobSpec(
                    completions=3,
                    parallelism=3,
                    completion_mode="Indexed",
                    backoff_limit_per_index=1,
                    max_failed_indexes=1,
                    template=template,
                ),
            ),
        )
        job_pods = eventually(
            lambda: (lambda items: items if len(items) == 3 else None)(
                core.list_namespaced_pod(ns, label_selector="app=indexed").items
            ),
            "the Indexed Job's 3 pods",
        )
        indexes = sorted(p.metadata.annotations["batch.kubernetes.io/job-completion-index"] for p in job_pods)
        assert indexes == ["0", "1", "2"]
        assert {p.spec.hostname for p in job_pods} == {"train-0", "train-1", "train-2"}


def test_a_namespace_deletion_finishes(control_plane: ControlPlane) -> None:
    api = api_client(control_plane)
    core = client.CoreV1Api(api)
    with namespace(api, "doomed") as ns:
        core.create_namespaced_config_map(ns, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="c")))
    # The namespace controller empties it, then removes its finalizer: the namespace is gone.
    eventually(
        lambda: ns not in {n.metadata.name for n in core.list_namespace().items}, f"namespace {ns} gone"
    )


def test_a_component_that_fails_to_start_is_named_with_its_log_and_nothing_is_left(tmp_path: Path) -> None:
    real = binaries()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "etcd").symlink_to(real["etcd"])
    for name in ("kube-controller-manager", "kube-scheduler"):
        (bin_dir / name).symlink_to(real[name])
    broken = bin_dir / "kube-apiserver"
    broken.write_text(
        '#!/bin/sh\necho \'Error: invalid argument "x" for "--service-cluster-ip-range"\' >&2\nexit 1\n'
    )
    broken.chmod(0o755)
    with (
        pytest.raises(ControlPlaneError) as failed,
        running_control_plane(tmp_path / "plane", bin_dir=bin_dir),
    ):
        pass
    first, *tail = str(failed.value).splitlines()
    assert first.startswith("kube-apiserver exited before ready (exited with code 1)"), first
    assert tail == ['Error: invalid argument "x" for "--service-cluster-ip-range"']
    assert not (tmp_path / "plane" / "startup.json").exists()
    # etcd had started: it, like anything else started under the work folder, is gone.
    left = _processes_mentioning(str(tmp_path / "plane"))
    assert left == []


def test_missing_binaries_are_named_with_the_make_target(tmp_path: Path) -> None:
    with pytest.raises(
        ControlPlaneError, match=r"^etcd, kube-apiserver, .* not built in .*`make controlplane`"
    ):
        binaries(tmp_path)


def test_the_command_line_prints_the_kubeconfig_and_a_stop_leaves_no_process_and_no_port(
    tmp_path: Path,
) -> None:
    """`python -m tools.controlplane up` (the context manager inside it) until SIGTERM: afterwards no
    process of it is alive and a server could listen on its ports again."""
    binaries()
    cli = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tools.controlplane",
            "up",
            "--dir",
            str(tmp_path),
            "--no-controllers",
            "--no-scheduler",
        ],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert cli.stdout is not None
        kubeconfig = Path(cli.stdout.readline().strip())
        assert kubeconfig == tmp_path / "admin.kubeconfig"
        server = yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]["server"]
        startup = json.loads((tmp_path / "startup.json").read_text())
        pids, ports = startup["pids"], startup["ports"]
        assert set(pids) == {"etcd", "kube-apiserver"}
        assert all(_alive(pid) for pid in pids.values())
        assert server.endswith(f":{ports['kube-apiserver']}")
        assert not _bindable(ports["kube-apiserver"]) and not _bindable(ports["etcd"])
    finally:
        cli.send_signal(signal.SIGTERM)
        _, err = cli.communicate(timeout=60)
    assert cli.returncode == 0, err
    assert "ready in" in err and server in err
    assert not [name for name, pid in pids.items() if _alive(pid)]
    assert all(_bindable(port) for port in ports.values())
