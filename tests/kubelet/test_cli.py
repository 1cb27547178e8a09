"""`python -m tools.kubelet`: registers its nodes with the API server of a kubeconfig, runs until SIGTERM,
then stops with nothing left running; its usage errors are one line each."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from kubernetes import client, config

from tests.clusterkit import wait_for
from tests.helpers import REPO_ROOT
from tools.controlplane.launch import ControlPlane


def cli(*args: str) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    return subprocess.Popen(
        [sys.executable, "-m", "tools.kubelet", *args],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_registers_its_nodes_and_stops_on_sigterm(control_plane: ControlPlane, tmp_path: Path) -> None:
    core = client.CoreV1Api(config.new_client_from_config(str(control_plane.kubeconfig)))
    proc = cli("--kubeconfig", str(control_plane.kubeconfig), "--gpu-nodes", "1", "--gpus", "2",
               "--root", str(tmp_path))  # fmt: skip
    try:
        node = wait_for(
            "gpu-node-0 registered",
            lambda: next((n for n in core.list_node().items if n.metadata.name == "gpu-node-0"), None),
            60,
        )
        assert node.metadata.labels["node.kubernetes.io/instance-type"] == "p5.48xlarge"
        wait_for("its status posted", lambda: core.read_node("gpu-node-0").status.allocatable, 30)
        assert core.read_node("gpu-node-0").status.allocatable["nvidia.com/gpu"] == "2"
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0, out
        assert "gpu-node-0, system-node-0 registered" in out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        # The Nodes stay after the kubelet (a real one's do too): gone before other tests schedule pods.
        for name in ("gpu-node-0", "system-node-0"):
            try:
                core.delete_node(name)
            except client.exceptions.ApiException as exc:
                assert exc.status == 404


def test_usage_errors_are_one_line(tmp_path: Path) -> None:
    proc = cli("--kubeconfig", str(tmp_path / "none"))
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert out.strip().splitlines()[-1].endswith(f"--kubeconfig: {tmp_path / 'none'} is not a file")
    kubeconfig = tmp_path / "k"
    kubeconfig.write_text("{}")
    proc = cli("--kubeconfig", str(kubeconfig), "--instance-type", "p9.huge")
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "--instance-type: instance type 'p9.huge'" in out
