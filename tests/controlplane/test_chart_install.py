"""The chart installed for real: infra's objects and the trainer release of the default team (the CDK
synth's values, Contract 1), the cluster smoke release, `helm upgrade` and the chart values a real API
server must refuse, all against the session's control plane (tools/controlplane).

No kubelet here: pods are created by the real controllers and admitted by the real admission plugins,
then stay Pending (this module runs before the process kubelet's modules in the session's `controlplane`
group, and those delete their nodes when they end). What needs them running (`helm test`'s verdict,
the training itself) is the process kubelet's part.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.controlplane.chart import (
    ADDON_NAMESPACES,
    CHART,
    PODMONITOR_CRD,
    TeamRelease,
    default_team_release,
    helm,
    kubectl,
    lost_fields,
    values_file,
)
from tests.controlplane.helpers import eventually
from tests.helpers import require_tool
from tools.controlplane.launch import ControlPlane
from tools.smoke_plan import SmokePlan, smoke_values

RELEASE = "trainer"
TRAINER = "app.kubernetes.io/component=trainer"


@pytest.fixture(scope="module")
def team(tmp_path_factory: pytest.TempPathFactory) -> TeamRelease:
    return default_team_release(tmp_path_factory.mktemp("synth"))


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("chart")


@pytest.fixture(scope="module")
def installed(control_plane: ControlPlane, team: TeamRelease, folder: Path) -> Iterator[TeamRelease]:
    """What `cdk deploy` does on the cluster: infra's manifests applied (kubectl apply, as the CDK kubectl
    provider does), then `helm install` of the trainer release with the synthesized values."""
    for namespace in ADDON_NAMESPACES:
        made = kubectl(control_plane, "create", "namespace", namespace)
        assert made.returncode == 0 or "AlreadyExists" in made.stderr, made.stderr
    manifests = folder / "manifests.json"
    manifests.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": team.manifests}))
    applied = kubectl(control_plane, "apply", "-f", str(manifests))
    assert applied.returncode == 0, applied.stderr
    install = helm(
        control_plane,
        "install",
        RELEASE,
        str(CHART),
        "-n",
        team.namespace,
        "-f",
        str(values_file(folder, "team", team.values)),
    )
    assert install.returncode == 0, install.stderr
    yield team
    # The session's control plane outlives this module: leave no namespace or volume that another
    # module's install of the same team would collide with.
    helm(control_plane, "uninstall", RELEASE, "-n", team.namespace)
    kubectl(control_plane, "delete", "-f", str(manifests), "--ignore-not-found", "--wait=false")
    kubectl(control_plane, "delete", "namespace", *ADDON_NAMESPACES, team.namespace, "--ignore-not-found")


def _objects(text: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(text) if doc]


def _stored(plane: ControlPlane, obj: dict[str, Any], namespace: str) -> dict[str, Any]:
    meta = obj["metadata"]
    group = obj["apiVersion"].rpartition("/")[0]
    args = ["get", f"{obj['kind']}.{group}" if group else obj["kind"], meta["name"], "-o", "json"]
    if obj["kind"] not in ("Namespace", "PersistentVolume"):
        args += ["-n", meta.get("namespace", namespace)]
    got = kubectl(plane, *args)
    assert got.returncode == 0, f"{obj['kind']} {meta['name']}: {got.stderr}"
    return dict(json.loads(got.stdout))


def _release_objects(plane: ControlPlane, release: str, namespace: str) -> list[dict[str, Any]]:
    manifest = helm(plane, "get", "manifest", release, "-n", namespace)
    assert manifest.returncode == 0, manifest.stderr
    return _objects(manifest.stdout)


def test_every_object_is_stored_exactly_as_sent(control_plane: ControlPlane, installed: TeamRelease) -> None:
    """Server-side validation passed (the install succeeded) and nothing was pruned or rewritten: a field
    the server does not know (a typo'd key, a key at the wrong level) would be dropped silently."""
    sent = installed.manifests + _release_objects(control_plane, RELEASE, installed.namespace)
    kinds = {o["kind"] for o in sent}
    assert {"Job", "Service", "Deployment", "NetworkPolicy", "Secret", "PersistentVolumeClaim"} <= kinds
    lost = {
        f"{o['kind']} {o['metadata']['name']}": problems
        for o in sent
        if (problems := lost_fields(o, _stored(control_plane, o, installed.namespace)))
    }
    assert lost == {}


def test_the_server_and_controllers_complete_the_release(
    control_plane: ControlPlane, installed: TeamRelease
) -> None:
    ns = installed.namespace
    (job,) = json.loads(kubectl(control_plane, "get", "jobs", "-n", ns, "-l", TRAINER, "-o", "json").stdout)[
        "items"
    ]
    # Defaults the chart relies on, filled in by the server.
    assert job["spec"]["suspend"] is True and job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["podReplacementPolicy"] == "Failed"  # the default with a podFailurePolicy
    # The PV binder bound infra's static FSx volume to the team's claim.
    eventually(
        lambda: (
            json.loads(kubectl(control_plane, "get", "pvc", "fsx-shared", "-n", ns, "-o", "json").stdout)[
                "status"
            ].get("phase")
            == "Bound"
        ),
        "fsx-shared Bound",
    )
    # The rendezvous Service got an address from the service range; the EndpointSlice controller made its
    # slice; the rendezvous Deployment's ReplicaSet made its pod.
    services = json.loads(kubectl(control_plane, "get", "svc", "-n", ns, "-o", "json").stdout)["items"]
    assert any(s["spec"]["clusterIP"].startswith("10.100.") for s in services)
    eventually(
        lambda: json.loads(kubectl(control_plane, "get", "endpointslices", "-n", ns, "-o", "json").stdout)[
            "items"
        ],
        "EndpointSlices of the release's Services",
    )


def test_helm_test_pods_are_admitted(control_plane: ControlPlane, installed: TeamRelease) -> None:
    """`helm test` creates its pods; they cannot finish without a kubelet, so `helm test` times out here.
    The first test pod is created for real; every test pod passes a server-side dry run (admission,
    validation, the team's GPU quota)."""
    ns = installed.namespace
    run = helm(control_plane, "test", RELEASE, "-n", ns, "--timeout", "3s")
    assert run.returncode != 0 and "trainer-test-node" in run.stderr, run.stderr
    created = json.loads(
        kubectl(control_plane, "get", "pod", "trainer-test-node", "-n", ns, "-o", "json").stdout
    )
    assert created["metadata"]["annotations"]["helm.sh/hook"] == "test"
    kubectl(control_plane, "delete", "pod", "trainer-test-node", "-n", ns, "--wait=false")
    hooks = _objects(helm(control_plane, "get", "hooks", RELEASE, "-n", ns).stdout)
    pods = [h for h in hooks if h["kind"] == "Pod"]
    assert len(pods) == 2
    for pod in pods:
        dry = kubectl(control_plane, "create", "--dry-run=server", "-n", ns, "-f", "-", stdin=json.dumps(pod))
        assert dry.returncode == 0, dry.stderr


def _job(plane: ControlPlane, namespace: str) -> dict[str, Any]:
    (job,) = json.loads(kubectl(plane, "get", "jobs", "-n", namespace, "-l", TRAINER, "-o", "json").stdout)[
        "items"
    ]
    return dict(job)


def _trainer_pods(plane: ControlPlane, namespace: str) -> list[dict[str, Any]]:
    return list(
        json.loads(kubectl(plane, "get", "pods", "-n", namespace, "-l", TRAINER, "-o", "json").stdout)[
            "items"
        ]
    )


def test_an_upgrade_that_flips_suspend_starts_the_same_job(
    control_plane: ControlPlane, installed: TeamRelease, folder: Path
) -> None:
    """start_trainer on a later deploy: the same Job (suspend is mutable), whose pods the real Job
    controller creates under the team's GPU quota: one per node plus the spare, with the index hostnames."""
    ns = installed.namespace
    before = _job(control_plane, ns)["metadata"]["name"]
    started = {**installed.values, "suspend": False}
    upgrade = helm(
        control_plane,
        "upgrade",
        RELEASE,
        str(CHART),
        "-n",
        ns,
        "-f",
        str(values_file(folder, "start", started)),
    )
    assert upgrade.returncode == 0, upgrade.stderr
    assert _job(control_plane, ns)["metadata"]["name"] == before
    count = installed.values["nodes"] + installed.values["spareNodes"]
    pods = eventually(
        lambda: (p := _trainer_pods(control_plane, ns)) and len(p) == count and p, f"{count} pods"
    )
    assert sorted(p["spec"]["hostname"] for p in pods) == [f"{before}-{i}" for i in range(count)]
    # Admission added what EKS adds: the extended-resource tolerations and the 300 s not-ready ones.
    keys = {t["key"] for t in pods[0]["spec"]["tolerations"]}
    assert {"nvidia.com/gpu", "vpc.amazonaws.com/efa", "node.kubernetes.io/not-ready"} <= keys


def test_only_the_trainer_pods_need_the_privileged_pod_security_level(
    control_plane: ControlPlane, installed: TeamRelease
) -> None:
    """docs/operations.md: the trainer pods need Pod Security level `privileged` (hostPath, IPC_LOCK);
    every other pod is hardened. The PodSecurity admission plugin's server-side dry run of a stricter
    label names the pods that would be refused: at `restricted`, only the trainer's."""
    ns = installed.namespace
    assert _trainer_pods(control_plane, ns), "the previous test started the trainer pods"
    others = json.loads(kubectl(control_plane, "get", "pods", "-n", ns, "-o", "json").stdout)["items"]
    assert {p["metadata"]["labels"].get("app.kubernetes.io/component") for p in others} >= {"rendezvous"}
    for level, reasons in (
        ("baseline", ("hostPath volumes", "capabilities")),
        ("restricted", ("volume types",)),
    ):
        label = f"pod-security.kubernetes.io/enforce={level}"
        dry = kubectl(control_plane, "label", "namespace", ns, label, "--dry-run=server", "--overwrite")
        assert dry.returncode == 0, dry.stderr
        refused = [
            line for line in dry.stderr.splitlines() if "violate" not in line and line.startswith("Warning:")
        ]
        assert len(refused) == 1, dry.stderr  # one group of pods with the same violations
        assert refused[0].split(":", 2)[1].strip().startswith(_job(control_plane, ns)["metadata"]["name"])
        assert all(reason in refused[0] for reason in reasons), refused[0]


def test_an_upgrade_with_another_image_replaces_the_job_the_server_would_not_change(
    control_plane: ControlPlane, installed: TeamRelease, folder: Path
) -> None:
    """A Job's pod template is immutable: the real server refuses a change in place, so the chart names
    the Job with a digest of its spec and `helm upgrade` replaces it (old pods deleted by the real garbage
    collector)."""
    ns = installed.namespace
    job = _job(control_plane, ns)
    old = job["metadata"]["name"]
    patch = {
        "spec": {"template": {"spec": {"containers": [{"name": "trainer", "image": "elsewhere/trainer:2"}]}}}
    }
    refused = kubectl(control_plane, "patch", "job", old, "-n", ns, "--type=merge", "-p", json.dumps(patch))
    assert refused.returncode != 0 and "field is immutable" in refused.stderr, refused.stderr

    values = json.loads(json.dumps(installed.values))
    values["suspend"] = False
    values["image"]["tag"] = "second-build"
    upgrade = helm(
        control_plane, "upgrade", RELEASE, str(CHART), "-n", ns, "-f", str(values_file(folder, "v2", values))
    )
    assert upgrade.returncode == 0, upgrade.stderr
    new = _job(control_plane, ns)
    assert new["metadata"]["name"] != old
    assert new["spec"]["template"]["spec"]["containers"][0]["image"].endswith(":second-build")
    eventually(
        lambda: (
            {
                p["metadata"]["labels"]["batch.kubernetes.io/job-name"]
                for p in _trainer_pods(control_plane, ns)
            }
            == {new["metadata"]["name"]}
        ),
        "only the new Job's pods",
    )


def test_the_cluster_smoke_release_is_accepted(
    control_plane: ControlPlane, installed: TeamRelease, folder: Path
) -> None:
    """The smoke run's second release (tools/cluster_smoke.py: the team's Contract 1 values plus the smoke
    plan) beside the team's own, suspended so that it takes no GPU quota here."""
    ns = installed.namespace
    values = {**smoke_values(installed.values, SmokePlan(), "smoke-check"), "suspend": True}
    install = helm(
        control_plane,
        "install",
        "smoke",
        str(CHART),
        "-n",
        ns,
        "-f",
        str(values_file(folder, "smoke", values)),
    )
    assert install.returncode == 0, install.stderr
    try:
        sent = _release_objects(control_plane, "smoke", ns)
        assert {o["kind"] for o in sent} >= {"Job", "Service"}
        lost = {
            o["metadata"]["name"]: p for o in sent if (p := lost_fields(o, _stored(control_plane, o, ns)))
        }
        assert lost == {}
    finally:
        helm(control_plane, "uninstall", "smoke", "-n", ns)


def test_a_prometheus_team_release_and_its_podmonitor_are_stored_exactly_as_sent(
    control_plane: ControlPlane, installed: TeamRelease, folder: Path
) -> None:
    """What differs for a team with the Prometheus collector (Contract 1: podMonitor.enabled, the metrics
    namespace), with prometheus-operator's PodMonitor CRD: its structural schema prunes any field it does
    not define, which the comparison would catch."""
    crd = require_tool(PODMONITOR_CRD, "the PodMonitor CRD")
    created = kubectl(control_plane, "create", "-f", str(crd))
    assert created.returncode == 0 or "AlreadyExists" in created.stderr, created.stderr
    deadline = time.monotonic() + 60
    while True:
        established = kubectl(
            control_plane,
            "wait",
            "--for=condition=Established",
            "crd/podmonitors.monitoring.coreos.com",
            "--timeout=60s",
        )
        # A CRD just created has no status.conditions yet, and kubectl's wait errors on it instead of
        # waiting ("accessor error: <nil> ..."): ask again.
        if established.returncode == 0 or "accessor error" not in established.stderr:
            break
        assert time.monotonic() < deadline, established.stderr
        time.sleep(0.2)
    assert established.returncode == 0, established.stderr
    ns = "prometheus-team"
    values = {
        **installed.values,
        "podMonitor": {**installed.values["podMonitor"], "enabled": True},
        "networkPolicy": {**installed.values["networkPolicy"], "metricsNamespace": "monitoring"},
    }
    install = helm(
        control_plane,
        "install",
        "metrics",
        str(CHART),
        "-n",
        ns,
        "--create-namespace",
        "-f",
        str(values_file(folder, "prometheus-team", values)),
    )
    assert install.returncode == 0, install.stderr
    try:
        sent = _release_objects(control_plane, "metrics", ns)
        assert "PodMonitor" in {o["kind"] for o in sent}
        lost = {
            o["metadata"]["name"]: p for o in sent if (p := lost_fields(o, _stored(control_plane, o, ns)))
        }
        assert lost == {}
    finally:
        helm(control_plane, "uninstall", "metrics", "-n", ns)
        kubectl(control_plane, "delete", "namespace", ns, "--wait=false")


# Values that once rendered and that only an install refused, with the field the refusal must name
# (the chart's schema and checks refuse most of them now, before the server sees them).
HOSTILE: dict[str, tuple[dict[str, Any], str]] = {
    "toleration-effect": (
        {"tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoScheduleX"}]},
        "tolerations",  # the schema's `/tolerations/0/effect`, the server's `spec.tolerations[0].effect`
    ),
    "affinity-string": ({"affinity": {"nodeAffinity": "yes please"}}, "nodeAffinity"),
    "huge-annotation": ({"podAnnotations": {"example.com/blob": "x" * 300 * 1024}}, "annotations"),
    "system-priority": ({"priorityClassName": "system-node-critical"}, "system-node-critical"),
}


# The API server admits system-node-critical in any namespace (its Priority admission has no namespace
# rule): the chart's own check is what refuses that one.
@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_values_are_refused_by_the_chart_or_the_server_naming_the_value(
    control_plane: ControlPlane, installed: TeamRelease, folder: Path, case: str
) -> None:
    extra, named = HOSTILE[case]
    release = f"hostile-{case}"
    values = {**installed.values, **extra}
    install = helm(
        control_plane,
        "install",
        release,
        str(CHART),
        "-n",
        installed.namespace,
        "-f",
        str(values_file(folder, release, values)),
    )
    helm(control_plane, "uninstall", release, "-n", installed.namespace)
    assert install.returncode != 0, f"{case}: installed"
    lines = install.stderr.strip().splitlines()
    errors = [line for line in lines if line.startswith("Error:")]
    # A schema refusal is helm's one `Error:` line with the path it names on the `- at '/...'` line below.
    naming = " ".join([*errors, *(line for line in lines if line.startswith("- at '/"))])
    assert len(errors) == 1 and named.lower() in naming.lower(), install.stderr[:2000]


def test_lost_fields_finds_a_dropped_or_changed_field_and_accepts_defaults_and_canonical_quantities() -> None:
    sent = {"spec": {"a": 1, "typo": True, "res": "5120Mi", "list": [{"x": "1"}], "empty": ""}}
    stored = {"spec": {"a": 1, "res": "5Gi", "list": [{"x": "2"}], "defaulted": "yes"}}
    assert lost_fields(sent, stored) == [".spec.typo", ".spec.list[0].x: sent '1', stored '2'"]
    assert lost_fields({"l": [1, 2]}, {"l": [1]}) == [".l"]
