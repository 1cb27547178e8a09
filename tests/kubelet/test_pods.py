"""The process kubelet under the real control plane: the scheduler binds, the kubelet runs, the API shows.

Each test reads what it checks from the real API server: pod phase, container states, exit codes,
restart counts, logs (served by the kubelet's endpoint through the API server's `pods/log`)."""

from __future__ import annotations

import time

from kubernetes import client

from tests.clusterkit import Cluster, wait_for

SH = ["sh", "-c"]


def test_nodes_registered_ready_with_the_devices_and_taint_the_chart_expects(cluster: Cluster) -> None:
    gpu = cluster.kubelet.nodes
    names = sorted(n for n in gpu if n.startswith("gpu-"))
    node = cluster.core.read_node(names[0])
    assert node.metadata.labels["node.kubernetes.io/instance-type"] == "p5.48xlarge"
    assert node.metadata.labels["blueprint.nvrx/node-role"] == "gpu"
    assert node.status.allocatable["nvidia.com/gpu"] == "8"
    assert node.status.allocatable["vpc.amazonaws.com/efa"] == "32"
    assert [(t.key, t.value, t.effect) for t in node.spec.taints or [] if t.key == "nvidia.com/gpu"] == [
        ("nvidia.com/gpu", "true", "NoSchedule")
    ]
    assert {c.type: c.status for c in node.status.conditions}["Ready"] == "True"
    coordination = client.CoordinationV1Api(cluster.api)
    first = coordination.read_namespaced_lease(names[0], "kube-node-lease").spec.renew_time
    wait_for(
        "a lease renewal",
        lambda: coordination.read_namespaced_lease(names[0], "kube-node-lease").spec.renew_time > first,
        10,
    )


def test_pod_runs_init_then_main_with_env_volumes_and_logs(cluster: Cluster) -> None:
    cluster.core.create_namespaced_config_map(
        cluster.namespace,
        {"metadata": {"name": "settings"}, "data": {"greeting": "hello", "file.txt": "from a file"}},
    )
    mounts = [{"name": "work", "mountPath": "/work"}, {"name": "cfg", "mountPath": "/etc/cfg"}]
    cluster.create_pod(
        "runs",
        restartPolicy="Never",
        initContainers=[
            {"name": "prepare", "image": "x", "command": SH, "args": ["echo prepared > /work/ready"],
             "volumeMounts": mounts}
        ],
        containers=[
            {
                "name": "main",
                "image": "x",
                "command": SH,
                "args": ['echo "$(GREETING) $(POD) on $(NODE) rdzv=$RDZV"; '
                         'cat /work/ready /etc/cfg/file.txt; echo; echo "shm=$SHM"'],
                "env": [
                    {"name": "GREETING",
                     "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "greeting"}}},
                    {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                    {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
                    {"name": "RDZV", "value": "trainer-rendezvous.team.svc.cluster.local:29400"},
                    {"name": "SHM", "value": "/dev/shm/snapshots"},
                ],
                "volumeMounts": [*mounts, {"name": "dshm", "mountPath": "/dev/shm"}],
            }
        ],
        volumes=[
            {"name": "work", "emptyDir": {}},
            {"name": "cfg",
             "configMap": {"name": "settings", "items": [{"key": "file.txt", "path": "file.txt"}]}},
            {"name": "dshm", "emptyDir": {"medium": "Memory"}},
        ],
    )  # fmt: skip
    pod = cluster.wait_phase("runs", ("Succeeded", "Failed"))
    assert pod.status.phase == "Succeeded"
    assert pod.status.init_container_statuses[0].state.terminated.exit_code == 0
    main = pod.status.container_statuses[0]
    assert main.state.terminated.exit_code == 0 and main.state.terminated.reason == "Completed"
    assert pod.status.pod_ip == "127.0.0.1"
    lines = cluster.log("runs").splitlines()
    assert lines[0] == f"hello runs on {pod.spec.node_name} rdzv=127.0.0.1:29400"
    assert lines[1:3] == ["prepared", "from a file"]
    shm = lines[3].removeprefix("shm=")
    # The pod's own /dev/shm: a folder of this pod's sandbox, not the host's.
    assert not shm.startswith("/dev/shm") and pod.metadata.uid in shm and shm.endswith("/snapshots")


def test_a_sidecar_is_started_before_the_main_container_and_stopped_after_it(cluster: Cluster) -> None:
    """A native sidecar (the chart's node-health daemon is one): the main container starts only once the
    sidecar's exec startup probe passes (with the container's paths), the pod completes although the
    sidecar never exits on its own, and an emptyDir's path is short enough for a Unix socket."""
    mounts = [{"name": "run", "mountPath": "/run/side"}]
    cluster.create_pod(
        "sidecar",
        restartPolicy="Never",
        terminationGracePeriodSeconds=5,
        initContainers=[
            {"name": "side", "image": "x", "restartPolicy": "Always", "command": SH,
             "args": ["sleep 2; echo up > /run/side/ready; exec sleep 600"], "volumeMounts": mounts,
             "startupProbe": {"exec": {"command": ["test", "-f", "/run/side/ready"]}, "periodSeconds": 1,
                              "failureThreshold": 60}},
        ],
        containers=[
            {"name": "main", "image": "x", "command": SH, "volumeMounts": mounts,
             "args": ['cat /run/side/ready; echo "dir=/run/side"']},
        ],
        volumes=[{"name": "run", "emptyDir": {}}],
    )  # fmt: skip
    pod = cluster.wait_phase("sidecar", ("Succeeded", "Failed"))
    assert pod.status.phase == "Succeeded"
    lines = cluster.log("sidecar", container="main").splitlines()
    assert lines[0] == "up", "the main container started before the sidecar's startup probe passed"
    folder = lines[1].removeprefix("dir=")
    assert pod.metadata.uid in folder and len(folder + "/health.sock") <= 107, folder
    side = pod.status.init_container_statuses[0]
    assert side.name == "side" and side.state.terminated is not None, side


def test_failing_container_reports_exit_code_and_never_restarts_under_never(cluster: Cluster) -> None:
    cluster.create_pod(
        "fails",
        restartPolicy="Never",
        containers=[{"name": "c", "image": "x", "command": SH, "args": ["exit 3"]}],
    )
    pod = cluster.wait_phase("fails", ("Succeeded", "Failed"))
    assert pod.status.phase == "Failed"
    status = pod.status.container_statuses[0]
    assert (status.state.terminated.exit_code, status.state.terminated.reason, status.restart_count) == (
        3,
        "Error",
        0,
    )


def test_on_failure_restarts_the_container_until_it_succeeds(cluster: Cluster) -> None:
    # Fails on its first run (no marker yet in the pod's emptyDir, which outlives a container restart).
    script = "if [ -f /scratch/ran ]; then echo second; exit 0; fi; touch /scratch/ran; echo first; exit 4"
    cluster.create_pod(
        "retries",
        restartPolicy="OnFailure",
        containers=[{"name": "c", "image": "x", "command": SH, "args": [script],
                     "volumeMounts": [{"name": "scratch", "mountPath": "/scratch"}]}],
        volumes=[{"name": "scratch", "emptyDir": {}}],
    )  # fmt: skip
    pod = cluster.wait_phase("retries", ("Succeeded", "Failed"))
    status = pod.status.container_statuses[0]
    assert pod.status.phase == "Succeeded"
    assert status.restart_count == 1
    assert status.last_state.terminated.exit_code == 4
    assert cluster.log("retries").strip() == "second"
    assert "BackOff" in kubelet_events(cluster, "retries")
    assert cluster.log("retries", previous=True).strip() == "first"


def test_a_signal_is_reported_as_128_plus_its_number(cluster: Cluster) -> None:
    # `$$$$`: the kubelet reads `$$` in args as a literal `$`, so the shell gets `kill -9 $$`.
    cluster.create_pod(
        "killed",
        restartPolicy="Never",
        containers=[{"name": "c", "image": "x", "command": SH, "args": ["kill -9 $$$$"]}],
    )
    pod = cluster.wait_phase("killed", ("Succeeded", "Failed"))
    assert pod.status.container_statuses[0].state.terminated.exit_code == 137


def test_deletion_sends_sigterm_then_removes_the_pod_and_its_processes(cluster: Cluster) -> None:
    # The trap writes to a hostPath file, which outlives the pod (the node's disk).
    script = (
        "trap 'echo term > /host/out; exit 0' TERM; echo started > /host/out; while true; do sleep 0.1; done"
    )
    cluster.create_pod(
        "graceful",
        containers=[{"name": "c", "image": "x", "command": SH, "args": [script],
                     "volumeMounts": [{"name": "host", "mountPath": "/host"}]}],
        volumes=[{"name": "host", "hostPath": {"path": "/var/graceful", "type": "DirectoryOrCreate"}}],
    )  # fmt: skip
    pod = cluster.wait_phase("graceful", ("Running",))
    out = cluster.kubelet.node_root(pod.spec.node_name) / "host/var/graceful/out"
    wait_for("the container's first line", lambda: out.is_file() and out.read_text() == "started\n", 20)
    pid = int(pod.status.container_statuses[0].container_id.removeprefix("process://"))
    cluster.core.delete_namespaced_pod("graceful", cluster.namespace, grace_period_seconds=10)
    wait_for("the pod object gone", lambda: cluster.pod("graceful") is None, 30)
    assert out.read_text() == "term\n"
    assert not _alive(pid)
    assert {"Started", "Killing"} <= kubelet_events(cluster, "graceful")


def test_deletion_kills_a_container_that_ignores_sigterm_after_the_grace_period(cluster: Cluster) -> None:
    cluster.create_pod(
        "stubborn",
        containers=[
            {
                "name": "c",
                "image": "x",
                "command": SH,
                "args": ["trap '' TERM; while true; do sleep 0.1; done"],
            }
        ],
    )
    pod = cluster.wait_phase("stubborn", ("Running",))
    pid = int(pod.status.container_statuses[0].container_id.removeprefix("process://"))
    started = time.monotonic()
    cluster.core.delete_namespaced_pod("stubborn", cluster.namespace, grace_period_seconds=2)
    wait_for("the pod object gone", lambda: cluster.pod("stubborn") is None, 30)
    took = time.monotonic() - started
    assert 2.0 <= took < 15.0, took
    assert not _alive(pid)


def kubelet_events(cluster: Cluster, pod: str) -> set[str]:
    """The reasons of the kubelet's events about `pod`."""
    events = cluster.core.list_namespaced_event(cluster.namespace).items
    return {
        e.reason
        for e in events
        if e.involved_object.name == pod and e.source and e.source.component == "kubelet"
    }


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
