"""Pod hardening, NetworkPolicy and the non-root run directories of the chart."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.chart.helm import by_kind, render, workload_pod_spec
from tools.podspec import trainer_pod

VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "non-root with synthetic data": {"runAsNonRoot": True, "syntheticTokens": 1000},
    "jobset": {"workload": "jobset"},
}


def _pods(manifests: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every pod spec the chart renders: the workload's and the helm test pods, by name."""
    pods = {"workload": workload_pod_spec(manifests)}
    pods.update({p["metadata"]["name"]: p["spec"] for p in by_kind(manifests, "Pod")})
    return pods


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_every_pod_and_container_is_hardened(name: str) -> None:
    for pod_name, pod in _pods(render(VALUE_SETS[name])).items():
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, pod_name
        assert pod["automountServiceAccountToken"] is False, pod_name
        scratch = {v["name"]: v for v in pod["volumes"]}["scratch"]
        assert scratch == {"name": "scratch", "emptyDir": {"sizeLimit": "20Gi"}}
        for c in pod.get("initContainers", []) + pod["containers"]:
            where = f"{pod_name}/{c['name']}"
            sc = c["securityContext"]
            assert sc["readOnlyRootFilesystem"] is True, where
            assert sc["allowPrivilegeEscalation"] is False and sc["privileged"] is False, where
            assert "ALL" in sc["capabilities"]["drop"], where
            assert {"name": "scratch", "mountPath": "/tmp"} in c["volumeMounts"], where
            requests = c["resources"]["requests"]
            assert requests["cpu"] and requests["memory"], where


def test_small_containers_have_limits_and_home_is_on_scratch() -> None:
    manifests = render(VALUE_SETS["non-root with synthetic data"])
    pods = _pods(manifests)
    workload = pods.pop("workload")
    small = [c for c in workload["initContainers"] if c["name"] != "check-config"]
    small += [c for pod in pods.values() for c in pod["containers"]]
    assert {c["name"] for c in small} == {"prepare-dirs", "synthetic-data", "node-health", "check", "summary"}
    for c in small:
        assert set(c["resources"]["limits"]) >= {"cpu", "memory"}, c["name"]
    pod = trainer_pod(manifests)
    for container in (pod.trainer, *pod.init_containers):
        if container.name != "synthetic-data":
            assert container.env["HOME"] == "/tmp", container.name


def test_helm_test_pods_are_non_root_without_capabilities() -> None:
    for name, pod in _pods(render()).items():
        if name == "workload":
            continue
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] == 10001
        (container,) = pod["containers"]
        assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}


# -- NetworkPolicy -----------------------------------------------------------------------------------
def _policies(values: dict[str, Any] | None = None, release: str = "r1") -> dict[str, dict[str, Any]]:
    manifests = render(values, release=release)
    return {
        p["metadata"]["labels"]["app.kubernetes.io/component"]: p for p in by_kind(manifests, "NetworkPolicy")
    }


def _selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector["matchLabels"].items())


def test_trainer_pods_accept_only_their_release_and_the_scrapers() -> None:
    manifests = render(release="r1")
    trainer_labels = by_kind(manifests, "Job")[0]["spec"]["template"]["metadata"]["labels"]
    other_release = by_kind(render(release="r2"), "Job")[0]["spec"]["template"]["metadata"]["labels"]
    policy = _policies()["trainer"]["spec"]
    assert _selects(policy["podSelector"], trainer_labels)
    assert policy["policyTypes"] == ["Ingress"]
    peers, scrapers = policy["ingress"]
    (peer,) = peers["from"]
    assert "ports" not in peers  # any port: the stores' ports change every rendezvous round
    assert _selects(peer["podSelector"], trainer_labels) and not _selects(peer["podSelector"], other_release)
    (scraper,) = scrapers["from"]
    assert scraper["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}
    assert scrapers["ports"] == [{"protocol": "TCP", "port": 9400}]


def test_metrics_scrapers_are_configurable_and_vanish_with_the_exporter() -> None:
    selector = {"matchLabels": {"team": "observability"}}
    pods = {"matchLabels": {"app.kubernetes.io/name": "prometheus"}}
    values = {
        "metricsPort": 9500,
        "networkPolicy": {"enabled": True, "metricsNamespaceSelector": selector, "metricsPodSelector": pods},
    }
    (_, scrapers) = _policies(values)["trainer"]["spec"]["ingress"]
    assert scrapers["from"] == [{"namespaceSelector": selector, "podSelector": pods}]
    assert scrapers["ports"] == [{"protocol": "TCP", "port": 9500}]
    (_, by_name) = _policies({"networkPolicy": {"metricsNamespace": "prom"}})["trainer"]["spec"]["ingress"]
    assert by_name["from"][0]["namespaceSelector"] == {"matchLabels": {"kubernetes.io/metadata.name": "prom"}}
    (peers,) = _policies({"metricsPort": 0})["trainer"]["spec"]["ingress"]
    assert "ports" not in peers


def test_helm_test_pods_get_no_traffic_and_the_policies_can_be_turned_off() -> None:
    manifests = render(release="r1")
    policy = _policies(release="r1")["test"]["spec"]
    assert (
        policy["policyTypes"] == ["Ingress", "Egress"] and "ingress" not in policy and "egress" not in policy
    )
    for pod in by_kind(manifests, "Pod"):
        assert _selects(policy["podSelector"], pod["metadata"]["labels"])
    assert _policies({"networkPolicy": {"enabled": False}}) == {}


# -- non-root on a fresh FSx -------------------------------------------------------------------------
def test_prepare_dirs_runs_only_for_a_non_root_trainer_with_the_fewest_capabilities() -> None:
    assert "prepare-dirs" not in [c.name for c in trainer_pod(render()).init_containers]
    pod = workload_pod_spec(render({"runAsNonRoot": True}))
    first = pod["initContainers"][0]
    assert first["name"] == "prepare-dirs"
    sc = first["securityContext"]
    assert (sc["runAsUser"], sc["runAsNonRoot"]) == (0, False)
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["CHOWN", "DAC_OVERRIDE", "FOWNER"]}


@pytest.fixture
def traversable_tmp() -> Iterator[Path]:
    """A scratch folder another user can traverse (pytest's tmp_path sits under a 0700 folder)."""
    path = Path(tempfile.mkdtemp(prefix="prepare-dirs-"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root, as in the pod")
def test_prepare_dirs_hands_a_fresh_fsx_run_to_the_trainer_user(traversable_tmp: Path) -> None:
    """Run the rendered prepare-dirs step on a fresh, root-owned 'FSx' and 'NVMe', then write as the
    trainer's user: the run's directories are writable, the file system root is not."""
    tmp_path = traversable_tmp
    uid, gid = 2000, 3000
    pod = trainer_pod(render({"runAsNonRoot": True, "runAsUser": uid, "runAsGroup": gid}, release="r1"))
    (step,) = [c for c in pod.init_containers if c.name == "prepare-dirs"]
    fsx, nvme = tmp_path / "fsx", tmp_path / "nvme"
    for root in (fsx, nvme):
        root.mkdir()
        root.chmod(0o755)
    (fsx / "shared-data").mkdir()  # an existing data directory is not taken over
    places = {
        "CHECKPOINT_DIR": str(fsx / "checkpoints" / "r1-trainer"),
        "OUT_DIR": str(fsx / "runs" / "r1-trainer"),
        "LOCAL_CHECKPOINT_DIR": str(nvme / "checkpoints" / "r1-trainer"),
        "DATA_PATH": str(fsx / "data" / "tokens.npy"),
    }
    env = {**step.env, **places}
    subprocess.run(step.resolved_argv(env), env={"PATH": os.environ["PATH"], **env}, check=True, timeout=30)
    for key in ("CHECKPOINT_DIR", "OUT_DIR", "LOCAL_CHECKPOINT_DIR"):
        st = Path(env[key]).stat()
        assert (st.st_uid, st.st_gid) == (uid, gid), key
    assert (fsx / "data").stat().st_uid == uid
    assert (fsx / "shared-data").stat().st_uid == 0

    def write_as_trainer(path: Path) -> int:
        as_user = ["setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups"]
        return subprocess.run(
            [*as_user, "sh", "-c", f"echo ok > '{path}'"], capture_output=True, timeout=30
        ).returncode

    assert write_as_trainer(Path(env["OUT_DIR"]) / "events.rank0.jsonl") == 0
    assert write_as_trainer(Path(env["LOCAL_CHECKPOINT_DIR"]) / "shard") == 0
    assert write_as_trainer(fsx / "stray") != 0  # without the step, this is where the trainer failed
