"""The smoke run's storage step: several probe processes at once against a local directory ("nodes"),
measured against the sizing's expectation (pass, and a fail with the numbers); the judging of per-node and
aggregate figures; the probe Job on the cluster through the real `kubernetes` client, the real API
server and the process kubelet."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from sizing import size
from sizing.teamfile import find_team, team_inputs
from tests.clusterkit import Cluster, kubelet_cluster, wait_for
from tests.helpers import REPO_ROOT
from tools import cluster_smoke as cs
from tools.controlplane.launch import ControlPlane
from tools.kube_watch import Kube
from tools.smoke_plan import (
    StorageExpectation,
    evaluate_storage,
    probe_job,
    storage_expectation,
)

BASE = {
    "image": {"repository": "111111111111.dkr.ecr.us-east-2.amazonaws.com/trainer", "tag": "f00d"},
    "nodes": 2,
    "instanceType": "p5.48xlarge",
    "gpusPerNode": 8,
    "storage": {"claimName": "fsx-shared", "localNvmePath": "/mnt/nvme"},
    "serviceAccountName": "trainer",
}


def smoke_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tools.cluster_smoke", *args],
        cwd=REPO_ROOT,
        env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)),
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )


def test_local_storage_step_prints_measured_against_the_teams_sizing(tmp_path: Path) -> None:
    """Three probe processes at once, files the size of the ml-research shard (capped at 20 MB)."""
    run = smoke_cli(
        f"--storage-local={tmp_path}", "--teams=teams.yaml", "--team=ml-research", "--local-nodes=3",
        "--storage-cap-bytes=20000000", "--storage-files=2", "--storage-fraction=0.0001",
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    # ml-research: 2400 GiB x 250 MB/s/TiB = 600 MB/s on 3 "nodes" of 2000 MB/s each.
    assert lines[0] == (
        "storage: expected 600 MB/s together (200 MB/s per node, FSx baseline 600 MB/s); fail below 0%"
    )
    nodes = [ln for ln in lines if ln.startswith("storage node ")]
    assert [ln.split(":")[0] for ln in nodes] == [f"storage node local-{n}" for n in range(3)]
    assert all("(2 x 20 MB, cache " in ln and ln.endswith("expected 200.0 MB/s") for ln in nodes)
    assert any(ln.startswith("storage aggregate of 3 nodes: write ") for ln in lines)
    assert lines[-1] == "PASS: storage keeps up with the sizing"
    assert list(tmp_path.iterdir()) == []  # every probe cleaned up


def test_local_storage_step_fails_well_below_expectation_with_the_numbers(tmp_path: Path) -> None:
    run = smoke_cli(
        f"--storage-local={tmp_path}", "--storage-expect-mbps=1e9", "--local-nodes=2",
        "--storage-cap-bytes=5000000",
    )  # fmt: skip
    assert run.returncode == 1
    lines = run.stdout.splitlines()
    assert lines[-1] == "storage step FAILED"
    fails = [ln for ln in lines if ln.startswith("FAIL: storage:")]
    assert any("below 50% of the expected 500,000,000.0 MB/s" in ln for ln in fails), fails
    assert any(ln.startswith("FAIL: storage: aggregate write ") for ln in fails)


def test_local_storage_step_needs_an_expectation(tmp_path: Path) -> None:
    run = smoke_cli(f"--storage-local={tmp_path}")
    assert run.returncode == 2
    assert "--storage-local needs --teams (the sizing) or --storage-expect-mbps" in run.stderr
    bad = smoke_cli(f"--storage-local={tmp_path}", "--teams=teams.yaml", "--team=nope")
    assert bad.returncode == 2 and "team=nope: no such team" in bad.stderr


def result(node: str, write: float, read: float, seconds: float = 1.0) -> dict[str, Any]:
    return {
        "probe": "storage", "node": node, "files": 8, "bytes_per_file": 10**8, "cache": "o_direct",
        "bytes_written": int(write * 1e6 * seconds), "write_s": seconds, "write_mbps": write,
        "bytes_read": int(read * 1e6 * seconds), "read_s": seconds, "read_mbps": read, "time_limited": False,
    }  # fmt: skip


def test_judging_per_node_and_aggregate() -> None:
    exp = StorageExpectation(
        nodes=2, files_per_node=8, bytes_per_file=10**8, aggregate_mbps=600, fsx_mbps=600
    )
    ok = evaluate_storage([result("a", 300, 400), result("b", 200, 300)], exp)
    assert ok.ok, ok.lines
    assert "storage aggregate of 2 nodes: write 500.0 MB/s, read 700.0 MB/s, expected 600.0 MB/s" in ok.lines
    slow = evaluate_storage([result("a", 300, 400), result("b", 100, 300, seconds=2.0)], exp)
    assert not slow.ok
    assert "FAIL: storage: node b writes 100.0 MB/s, below 50% of the expected 300.0 MB/s" in slow.lines
    # a: 300 MB in 1 s, b: 200 MB in 2 s: 500 MB over the slowest node's 2 s.
    assert "FAIL: storage: aggregate write 250.0 MB/s is below 50% of the expected 600.0 MB/s" in slow.lines
    missing = evaluate_storage([result("a", 900, 900)], exp)
    assert "FAIL: storage: 1 of 2 nodes reported a storage measurement" in missing.lines
    assert not evaluate_storage([], exp).ok
    with pytest.raises(cs.SmokeError, match="storage-fraction"):
        StorageExpectation(2, 8, 10**8, 600, 600, fraction=0)


def test_expectation_from_the_sizing() -> None:
    data = yaml.safe_load((REPO_ROOT / "teams.yaml").read_text())
    sizing = size(team_inputs(find_team(data, "llm-platform")))  # 1200 GiB x 1000 MB/s/TiB
    exp = storage_expectation(sizing)
    assert (exp.nodes, exp.files_per_node, exp.aggregate_mbps) == (2, 8, pytest.approx(1200))
    assert exp.bytes_per_file == sizing.shard_bytes_per_rank  # one rank's shard: 6.0 GB for 8b on 16
    assert storage_expectation(sizing, cap_bytes=10**9).bytes_per_file == 10**9
    assert storage_expectation(sizing, nodes=1).aggregate_mbps == pytest.approx(1200)  # one client: 2000


def test_the_probe_job_is_a_valid_manifest_with_the_probe_command() -> None:
    exp = StorageExpectation(3, 8, 6 * 10**9, 600, 600)
    job = probe_job(BASE, exp, "s-storage-1", "s-storage", "run-1", 120, 1_700_000_000.0)
    kubernetes_validate.validate(job, "1.35.0", strict=True)
    spec = job["spec"]
    assert spec["completions"] == spec["parallelism"] == 3 and spec["completionMode"] == "Indexed"
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    assert container["image"] == "111111111111.dkr.ecr.us-east-2.amazonaws.com/trainer:f00d"
    assert container["command"][:3] == ["python", "-m", "trainer.checkpoint.storage_probe"]
    assert "--dir=/fsx/smoke/storage/run-1/$(JOB_COMPLETION_INDEX)" in container["command"]
    assert "--bytes=6000000000" in container["command"] and "--files=8" in container["command"]
    assert "--expect-mbps=200.000" in container["command"]
    assert pod["volumes"][0]["persistentVolumeClaim"]["claimName"] == "fsx-shared"
    assert pod["nodeSelector"]["node.kubernetes.io/instance-type"] == "p5.48xlarge"


@pytest.fixture
def cluster(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with kubelet_cluster(control_plane, tmp_path_factory.mktemp("nodes")) as cl:
        yield cl


def shared_storage(cl: Cluster, claim: str, account: str) -> None:
    """The team's FSx claim as a statically bound volume (the kubelet maps its path to one folder every
    node shares), and the trainer's service account."""
    pv = f"{cl.namespace}-fsx"
    cl.core.create_persistent_volume(
        {"metadata": {"name": pv},
         "spec": {"capacity": {"storage": "1200Gi"}, "accessModes": ["ReadWriteMany"], "storageClassName": "",
                  "persistentVolumeReclaimPolicy": "Retain", "hostPath": {"path": f"/{pv}"},
                  "claimRef": {"namespace": cl.namespace, "name": claim}}}
    )  # fmt: skip
    cl.core.create_namespaced_persistent_volume_claim(
        cl.namespace,
        {"metadata": {"name": claim},
         "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": pv,
                  "resources": {"requests": {"storage": "1200Gi"}}}},
    )  # fmt: skip
    cl.core.create_namespaced_service_account(cl.namespace, {"metadata": {"name": account}})


def test_cluster_storage_step_through_the_api(cluster: Cluster, tmp_path: Path) -> None:
    """The probe Job is created on the real API server, its pods (the real probe, one per node: the
    scheduler honours its anti-affinity) run by the process kubelet on the shared claim, their lines read
    through pods/log and judged, and the Job deleted."""
    shared_storage(cluster, BASE["storage"]["claimName"], BASE["serviceAccountName"])
    kube = Kube(cluster.api, cluster.namespace, log=lambda _: None, logs_dir=tmp_path / "logs")
    args = argparse.Namespace(
        release="trainer-smoke", storage_start_slack=3.0, storage_time_limit=30.0, start_timeout=60.0
    )
    exp = StorageExpectation(2, 2, 2 * 10**6, 0.2, 0.2)  # 2 nodes x 2 files of 2 MB; any disk passes
    verdict = cs.cluster_storage_step(args, kube, BASE, exp, "run-1")
    assert verdict.ok, verdict.lines
    text = "\n".join(verdict.lines)
    nodes = sorted(n for n in cluster.kubelet.nodes if n.startswith("gpu-"))
    for node in nodes:
        assert f"storage node {node}: write " in text
    assert "storage aggregate of 2 nodes" in text
    # The probes worked under the claim's folder (and removed their files).
    assert (cluster.kubelet.storage_root / f"{cluster.namespace}-fsx" / "smoke/storage/run-1").is_dir()
    wait_for(
        "the probe Job deleted",
        lambda: not cluster.batch.list_namespaced_job(cluster.namespace).items,
        30,
    )
