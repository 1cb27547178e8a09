"""The rendezvous service the chart installs beside the workload (templates/rendezvous.yaml): no training
pod hosts the launchers' store, so pod 0 is a node like any other (docs/failure-domains.md)."""

from __future__ import annotations

import pytest
import yaml

from tests.chart.helm import by_kind, env_of, rejection, render, trainer_container
from tools.podcommand import rendezvous_argv
from tools.podspec import load_manifests, trainer_pod


def _rendezvous(manifests: list[dict]) -> tuple[dict, dict, dict]:
    (deployment,) = [
        m for m in by_kind(manifests, "Deployment") if m["metadata"]["name"].endswith("-rendezvous")
    ]
    (service,) = [m for m in by_kind(manifests, "Service") if m["metadata"]["name"].endswith("-rendezvous")]
    (policy,) = [
        m for m in by_kind(manifests, "NetworkPolicy") if m["metadata"]["name"].endswith("-rendezvous")
    ]
    return deployment, service, policy


def test_one_replica_replaced_not_rolled_on_the_trainer_image() -> None:
    manifests = render({"nodes": 4, "spareNodes": 1})
    deployment, _, _ = _rendezvous(manifests)
    spec = deployment["spec"]
    assert spec["replicas"] == 1
    assert spec["strategy"] == {"type": "Recreate"}  # never two stores at once
    (container,) = spec["template"]["spec"]["containers"]
    assert container["command"] == ["python", "-m", "trainer.launcher.rendezvous"]
    assert container["image"] == trainer_container(manifests)["image"]
    assert container["readinessProbe"]["tcpSocket"]["port"] == "rdzv"
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert spec["template"]["metadata"]["labels"]["app.kubernetes.io/component"] == "rendezvous"
    # No GPU: it does not ask for one and carries no GPU toleration, so it lands on the system nodes.
    assert "nvidia.com/gpu" not in str(container["resources"])
    assert "tolerations" not in spec["template"]["spec"]


def test_restarted_when_its_port_stops_answering_but_never_for_being_busy() -> None:
    deployment, _, _ = _rendezvous(render())
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    liveness = container["livenessProbe"]
    assert liveness["tcpSocket"]["port"] == "rdzv"  # the store itself, not a side endpoint
    # A minute of refused connects, after the interpreter had 30 s to start, before a restart.
    assert liveness["initialDelaySeconds"] >= 30
    assert liveness["periodSeconds"] * liveness["failureThreshold"] >= 60
    assert liveness["timeoutSeconds"] >= 5
    limits, requests = container["resources"]["limits"], container["resources"]["requests"]
    assert int(limits["cpu"]) >= 2 * int(requests["cpu"])  # room for a restart round's burst
    assert pod["automountServiceAccountToken"] is False  # it serves a TCP store and calls no API


@pytest.mark.parametrize(
    "values", [{}, {"nodes": 3, "spareNodes": 2, "rdzvPort": 29555, "rdzvLastCallTimeout": 0}]
)
def test_its_arguments_are_what_the_local_harness_derives_from_the_pod_command(values: dict) -> None:
    """tools/podcommand.py rendezvous_argv (what LocalJob and the demo run) and the Deployment agree:
    the same node range, id and --rdzv-conf as the launchers, listening on rdzvPort."""
    manifests = render(values)
    deployment, _, _ = _rendezvous(manifests)
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    port = values.get("rdzvPort", 29400)
    pod = trainer_pod(load_manifests(yaml.safe_dump_all(manifests)))
    argv = pod.trainer.resolved_argv({**pod.trainer.env, "RDZV_ENDPOINT": f"127.0.0.1:{port}"})
    assert container["args"] == rendezvous_argv(argv)[3:]


def test_nvrx_control_parses_the_rendered_arguments() -> None:
    from nvidia_resiliency_ext.fault_tolerance import control_plane

    deployment, _, _ = _rendezvous(render({"nodes": 2, "spareNodes": 1, "rdzvJoinTimeout": 77}))
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    args = control_plane.parse_args(container["args"])
    assert args.nnodes == "2:3"
    assert args.rdzv_id.endswith("-trainer")
    assert "join_timeout=77" in args.rdzv_conf


@pytest.mark.parametrize("workload", ["job", "jobset"])
def test_every_launcher_is_a_client_of_the_service(workload: str) -> None:
    manifests = render({"workload": workload}, release="r1")
    _, service, _ = _rendezvous(manifests)
    env = env_of(trainer_container(manifests))
    assert env["RDZV_ENDPOINT"] == f"{service['metadata']['name']}.team-a.svc.cluster.local:29400"
    # No launcher hosts: none has the Service's name (torch decides by host name when is_host is unset).
    conf = next(a for a in trainer_container(manifests)["args"] if a.startswith("--rdzv-conf="))
    assert "is_host" not in conf
    assert service["spec"]["selector"]["app.kubernetes.io/component"] == "rendezvous"
    assert service["spec"]["ports"] == [{"name": "rdzv", "port": 29400, "targetPort": "rdzv"}]


def test_only_the_release_trainer_pods_reach_it_on_its_port() -> None:
    _, _, policy = _rendezvous(render({"rdzvPort": 29555}))
    spec = policy["spec"]
    assert spec["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "rendezvous"
    (rule,) = spec["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 29555}]
    (source,) = rule["from"]
    assert source["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "trainer"


def test_a_new_workload_gets_a_fresh_store() -> None:
    """The Deployment's pod carries the workload's name (a digest of its spec), so a changed workload
    replaces the service too: the old store's rendezvous was shut down when its run ended."""

    def workload_annotation(values: dict) -> str:
        deployment, _, _ = _rendezvous(render(values))
        return deployment["spec"]["template"]["metadata"]["annotations"]["blueprint.nvrx/workload"]

    (job,) = by_kind(render({}), "Job")
    assert workload_annotation({}) == job["metadata"]["name"]
    assert workload_annotation({"steps": 123}) != workload_annotation({})


def test_scheduling_values_reach_the_pod_and_are_checked() -> None:
    values = {
        "rendezvous": {
            "nodeSelector": {"eks.amazonaws.com/nodegroup": "system"},
            "tolerations": [{"key": "CriticalAddonsOnly", "operator": "Exists"}],
            "resources": {"requests": {"cpu": "2"}},
        }
    }
    deployment, _, _ = _rendezvous(render(values))
    pod = deployment["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"eks.amazonaws.com/nodegroup": "system"}
    assert pod["tolerations"] == [{"key": "CriticalAddonsOnly", "operator": "Exists"}]
    assert pod["containers"][0]["resources"]["requests"]["cpu"] == "2"  # merged over the default
    assert "rendezvous" in rejection(
        {"rendezvous": {"nodeSelector": {"a": 1}, "tolerations": [], "resources": {}}}
    )
    assert "rendezvous" in rejection({"rendezvous": {"replicas": 2}})
