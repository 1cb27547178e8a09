"""Local multi-pod runs give each pod the node-local places of a node of its own (tools/localpods.py
node_places): its own NVMe tier and /dev/shm, empty again in a replacement pod. With one folder for every
pod, a node that replaced a lost one restored its ranks from `local` or `shm` copies that only the lost
node had; a real replacement is a fresh machine, so it must get them from a peer or the FSx checkpoint."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from bench import recovery_pods
from tools.localpods import LocalJob, node_places, node_pod_spec
from tools.podcommand import LocalPlaces


def _flag(argv: list[str], name: str) -> str:
    (value,) = [a.split("=", 1)[1] for a in argv if a.startswith(f"{name}=")]
    return value


def test_each_pod_of_a_local_job_has_its_own_nvme_and_shm_and_shares_the_rest(tmp_path: Path) -> None:
    sc = recovery_pods.SCENARIOS["node-loss/peer"]  # 2 nodes + 1 spare, snapshots replicated
    specs = recovery_pods.pod_specs(sc, recovery_pods.PodsConfig(), tmp_path, tmp_path / "t.npy", 4321)
    assert len(specs) == 3
    local = [_flag(list(s.argv), "--ckpt-local-dir") for s in specs]
    shm = [_flag(list(s.argv), "--snapshot-dir") for s in specs]
    assert len(set(local)) == len(set(shm)) == 3, (local, shm)
    assert not set(local) & set(shm)
    for spec, lo, sh in zip(specs, local, shm, strict=True):
        # what a replacement pod of this index finds empty: exactly its node's folders
        assert set(spec.fresh_dirs) == {Path(lo), Path(sh)}, spec.fresh_dirs
    for shared in ("--ckpt-dir", "--out-dir", "--data-path"):
        assert len({_flag(list(s.argv), shared) for s in specs}) == 1, shared


# Attempt 0 writes a "checkpoint" into its node's NVMe folder and a snapshot into its /dev/shm, then waits
# to be lost; the replacement exits 0 only if it finds both empty.
POD = """
import os, sys, time
local, shm, marker = sys.argv[1:4]
if not os.path.exists(marker):
    os.makedirs(os.path.join(local, "step_3"))
    open(os.path.join(shm, "rank1.slot0"), "w").write("snapshot")
    open(marker, "w").write("started")
    time.sleep(600)
sys.exit(0 if os.listdir(local) == [] and os.listdir(shm) == [] else 7)
"""


def test_a_replaced_pod_finds_its_node_local_folders_empty_and_other_pods_keep_theirs(
    tmp_path: Path,
) -> None:
    base = LocalPlaces(4321, tmp_path / "t.npy", tmp_path / "run")
    lost, survivor = node_places(base, 1), node_places(base, 0)
    assert survivor.local_ckpt_dir is not None and survivor.snapshot_dir is not None
    kept = survivor.local_ckpt_dir / "step_3"
    kept.mkdir(parents=True)  # the survivor's NVMe: not this job's pod, untouched
    marker = tmp_path / "attempt0"
    argv = [sys.executable, "-c", POD, str(lost.local_ckpt_dir), str(lost.snapshot_dir), str(marker)]
    spec = node_pod_spec("pod-1", argv, dict(os.environ), tmp_path / "pod.log", lost)
    with LocalJob([spec], backoff_limit=0) as job:
        job.start()
        deadline = time.monotonic() + 60
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert marker.exists(), (tmp_path / "pod.log").read_text()[-2000:]
        job.kill_pod(0)  # the node is lost; the controller starts the pod of index 0 again
        result = job.wait(timeout_s=60)
    assert result.succeeded, (result.reason, (tmp_path / "pod.log").read_text()[-2000:])
    assert [e.reason for e in result.exits] == ["disrupted", "succeeded"]
    assert kept.is_dir()
