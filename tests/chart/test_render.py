"""The chart renders valid Kubernetes 1.35 objects for the value sets users and infra will use."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.chart.helm import CHART, HELM, by_kind, helm, render, workload_pod_spec

K8S_VERSION = "1.35.0"
# kubernetes-validate has schemas for built-in kinds only; CRD kinds are skipped and listed here.
CRD_KINDS = {"JobSet"}

LOCAL_CPU = yaml.safe_load((CHART / "examples" / "local-cpu.yaml").read_text())
BYO = yaml.safe_load((CHART / "examples" / "byo-values.yaml").read_text())
# The local demo's values (tools/demo-values.yaml, the lead's): the chart must keep accepting them.
DEMO = yaml.safe_load((CHART.parent / "tools" / "demo-values.yaml").read_text())

VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "local-cpu-example": LOCAL_CPU,
    "byo-example": BYO,
    "demo": DEMO,
    "p5": {"instanceType": "p5.48xlarge"},
    "p5e": {"instanceType": "p5e.48xlarge"},
    "p5en": {"instanceType": "p5en.48xlarge"},
    "p4d": {"instanceType": "p4d.24xlarge"},
    "one-node": {"nodes": 1},
    "sixteen-nodes": {"nodes": 16},
    "faults": {
        "preset": "small",
        "seqLen": 256,
        "steps": 60,
        "faults": {"soft": "exception:step=20:rank=1", "hard": "sigkill:step=40:rank=3"},
    },
    "inprocess-off": {"inprocess": False},
    "jobset": {"workload": "jobset", "nodes": 4},
    "everything-else": {
        "runAsNonRoot": True,
        "syntheticTokens": 1000000,
        "efaPerNode": 0,
        "hugepages2Mi": "",
        "memoryLimit": "1800Gi",
        "extraEnv": {"NCCL_NVLS_ENABLE": "0", "TORCH_LOGS": "dynamo"},
        "extraTrainerArgs": ["--snapshot-dir=/dev/shm/snap"],
        "activeDeadlineSeconds": 86400,
        "ttlSecondsAfterFinished": 3600,
        "failJobExitCodes": [2, 93, 137],
        "priorityClassName": "training",
        "schedulerName": "volcano",
        "podLabels": {"team": "a"},
        "podAnnotations": {"note": "x"},
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}
                    ]
                }
            }
        },
        "image": {"repository": "123.dkr.ecr.us-west-2.amazonaws.com/trainer", "tag": "sha256:" + "a" * 64},
    },
}


def validate_all(manifests: list[dict[str, Any]]) -> set[str]:
    """Validate every manifest strictly; return the kinds skipped for lack of a schema."""
    skipped = set()
    for manifest in manifests:
        try:
            kubernetes_validate.validate(manifest, K8S_VERSION, strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            skipped.add(manifest["kind"])
    return skipped


def test_helm_lint_strict() -> None:
    result = helm("lint", "--strict", str(CHART))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_renders_valid_kubernetes(name: str) -> None:
    manifests = render(VALUE_SETS[name])
    skipped = validate_all(manifests)
    assert skipped <= CRD_KINDS, f"no schema for {skipped - CRD_KINDS}"
    kinds = sorted(m["kind"] for m in manifests if m["kind"] != "NetworkPolicy")
    policies = by_kind(manifests, "NetworkPolicy")
    # trainer pods, the rendezvous service's pod, the helm test pods
    assert len(policies) == (3 if VALUE_SETS[name].get("networkPolicy", {}).get("enabled", True) else 0)
    # Secret: the release's replica key; Deployment and a Service: the rendezvous service.
    if VALUE_SETS[name].get("workload") == "jobset":
        assert kinds == ["Deployment", "JobSet", "Pod", "Pod", "Secret", "Service"]
    else:
        assert kinds == ["Deployment", "Job", "Pod", "Pod", "Secret", "Service", "Service"]


def test_every_example_is_a_value_set() -> None:
    """Each file in k8s/examples is rendered and validated above (a new example cannot be left out)."""
    examples = {path.name: yaml.safe_load(path.read_text()) for path in (CHART / "examples").glob("*.yaml")}
    assert {"local-cpu.yaml", "byo-values.yaml"} <= set(examples)
    for name, values in examples.items():
        assert values in VALUE_SETS.values(), name


def test_validator_catches_an_invalid_manifest() -> None:
    """Guard against a validator that passes everything: a typo'd field must fail strict validation."""
    (job,) = by_kind(render(), "Job")
    job["spec"]["template"]["spec"]["containers"][0]["volumeMount"] = []
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, K8S_VERSION, strict=True)


def test_indexed_job_and_headless_service() -> None:
    manifests = render({"nodes": 16})
    (job,) = by_kind(manifests, "Job")
    (svc,) = [s for s in by_kind(manifests, "Service") if s["spec"].get("clusterIP") == "None"]
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    assert spec["parallelism"] == spec["completions"] == 16
    pod = spec["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    assert pod["subdomain"] == svc["metadata"]["name"]
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["publishNotReadyAddresses"] is True
    # The Service selects the trainer pods (not the helm test pods) by labels they carry.
    pod_labels = spec["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= pod_labels.items()
    assert svc["spec"]["selector"]["app.kubernetes.io/component"] == "trainer"
    assert "app.kubernetes.io/version" not in svc["spec"]["selector"]


@pytest.mark.parametrize(("nodes", "per_index", "expected"), [(2, 3, 6), (16, 3, 48), (8, 1, 8)])
def test_total_pod_retries_scale_with_nodes_by_default(nodes: int, per_index: int, expected: int) -> None:
    # Retries scale with the job: a fixed total would end big jobs sooner (each index has its own budget).
    (job,) = by_kind(render({"nodes": nodes, "podRetriesPerIndex": per_index}), "Job")
    assert job["spec"]["backoffLimit"] == expected


def test_failure_policy_leaves_restarts_to_ft_launcher_and_replaces_lost_pods() -> None:
    (job,) = by_kind(render({"podRetriesPerIndex": 2, "podRetriesTotal": 5}), "Job")
    spec = job["spec"]
    assert spec["backoffLimitPerIndex"] == 2
    assert spec["backoffLimit"] == 5
    assert spec["maxFailedIndexes"] == 0
    assert spec["podReplacementPolicy"] == "Failed"
    ignore, evicted, fail_job = spec["podFailurePolicy"]["rules"]
    assert ignore == {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
    # A straggler evicted into a hot spare leaves with its own status: replaced, not counted.
    from trainer.resilience.straggler import EVICTED_EXIT

    assert evicted == {
        "action": "Ignore",
        "onExitCodes": {"containerName": "trainer", "operator": "In", "values": [EVICTED_EXIT]},
    }
    assert fail_job["action"] == "FailJob"
    # No containerName: exit code 2 of the check-config init container fails the Job too.
    assert fail_job["onExitCodes"] == {"operator": "In", "values": [2, 93]}
    assert spec["suspend"] is False
    assert spec["template"]["spec"]["automountServiceAccountToken"] is False
    (suspended,) = by_kind(render({"suspend": True}), "Job")
    assert suspended["spec"]["suspend"] is True


def test_jobset_pods_reach_the_rendezvous_service() -> None:
    manifests = render({"workload": "jobset"}, release="big")
    (jobset,) = by_kind(manifests, "JobSet")
    assert jobset["spec"]["network"]["enableDNSHostnames"] is True  # MASTER_ADDR is a pod's FQDN
    env = {e["name"]: e["value"] for e in workload_pod_spec(manifests)["containers"][0]["env"]}
    assert env["RDZV_ENDPOINT"] == "big-trainer-rendezvous.team-a.svc.cluster.local:29400"
    assert "subdomain" not in workload_pod_spec(manifests)  # the JobSet controller sets it


def test_jobset_needs_its_api_in_the_cluster() -> None:
    result = helm("template", "x", str(CHART), values={"workload": "jobset"})
    assert result.returncode != 0
    assert "workload=jobset needs the JobSet controller" in result.stderr


@pytest.mark.parametrize("workload", ["job", "jobset"])
def test_long_release_names_keep_hostnames_within_63_characters(workload: str) -> None:
    release = "a-long-release-name-for-a-training-run-of-team-alpha"  # helm allows at most 53
    manifests = render({"nodes": 16, "workload": workload}, release=release)
    name = next(m for m in manifests if m["kind"] in ("Job", "JobSet"))["metadata"]["name"]
    hostname = f"{name}-15" if workload == "job" else f"{name}-trainer-0-15"
    assert len(hostname) <= 63
    env = {e["name"]: e["value"] for e in workload_pod_spec(manifests)["containers"][0]["env"]}
    service = env["RDZV_ENDPOINT"].split(".")[0]  # the rendezvous service's Service, a DNS-1035 label
    assert service in {m["metadata"]["name"] for m in by_kind(manifests, "Service")}
    assert len(service) <= 63
    assert HELM.exists()


def test_local_cpu_example_drops_cluster_only_parts() -> None:
    manifests = render(LOCAL_CPU)
    (job,) = by_kind(manifests, "Job")
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert "vpc.amazonaws.com/efa" not in container["resources"]["limits"]
    assert "hugepages-2Mi" not in container["resources"]["limits"]
    assert [p["name"] for p in container["ports"]] == ["rdzv"]  # metricsPort 0: exporter off
    assert "--device=cpu" in container["args"]


def test_notes_tell_where_the_run_writes() -> None:
    result = helm(
        "install", "x", str(CHART), "--dry-run=client", "--namespace", "team-a", values={"nodes": 3}
    )
    assert result.returncode == 0, result.stderr
    notes = result.stdout.split("NOTES:", 1)[1]
    assert "3 x p5.48xlarge, 24 ranks" in notes
    (job,) = by_kind(render({"nodes": 3}, release="x"), "Job")
    job_label = (
        f"batch.kubernetes.io/job-name={job['metadata']['name']},batch.kubernetes.io/job-completion-index=0"
    )
    assert job_label in notes
    assert "/fsx/runs/x-trainer" in notes
    assert "helm test x -n team-a" in notes
