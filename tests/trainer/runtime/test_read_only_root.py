"""The trainer writes nothing outside its mounted paths, so its pods can run with a read-only root
filesystem (k8s/templates/_security.tpl).

The rendered pod's init containers and its `ft_launcher ... -m trainer` command (1 pod x 2 ranks, NVRx
in-process restart and async checkpoints on) run in a private mount namespace where the whole root
filesystem, the Python environment included, is remounted read-only. Writable are only the places a pod
has: the 'FSx' and 'NVMe' folders, the scratch folder that HOME and TMPDIR point at (the pod's /tmp
emptyDir), and /dev/shm. The trainer runs from a copy of the working tree, mounted read-only as well. A
write anywhere else fails with EROFS, and so fails the run.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.chart.helm import render
from tests.helpers import REPO_ROOT, free_port
from tools.podcommand import LOCAL_KEY_FILES
from tools.podspec import Container, trainer_pod

pytestmark = pytest.mark.slow

# Inside a new mount namespace: keep the sandbox writable, make the tree and then / read-only, run.
SANDBOX = """
set -e
mount --make-rprivate /
mount --bind "$RO_BASE" "$RO_BASE"
mount --bind "$RO_TREE" "$RO_TREE"
mount -o remount,bind,ro "$RO_TREE"
mount -o remount,bind,ro /
exec "$@"
"""


@pytest.fixture
def sandbox() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="ro-root-"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _sandboxed(argv: list[str], base: Path, tree: Path) -> list[str]:
    return ["unshare", "--mount", "sh", "-c", SANDBOX, "sandbox", *argv]


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))
    }


@pytest.mark.skipif(
    os.geteuid() != 0, reason="a private mount namespace needs root (as on the dev machine and CI)"
)
def test_the_pod_command_runs_on_a_read_only_root(sandbox: Path) -> None:
    tree, fsx, nvme, scratch = (sandbox / d for d in ("tree", "fsx", "nvme", "scratch"))
    shutil.copytree(REPO_ROOT / "trainer", tree / "trainer", ignore=shutil.ignore_patterns("__pycache__"))
    for folder in (fsx, nvme, scratch):
        folder.mkdir()
    values = yaml.safe_load((REPO_ROOT / "tools" / "demo-values.yaml").read_text())
    values.update({"nodes": 1, "steps": 8, "ckptInterval": 3, "syntheticTokens": 50000})
    values["faults"] = {}  # a plain run: no faults (the chart default)
    # Minutes, not the demo's seconds: on a loaded 2-core machine a slow step must not look like a hang
    # (this test is about where the run writes, not about recovery). The exporter gets a free port.
    values.update(
        {
            "collectiveTimeout": 60,
            "inprocessSoftTimeout": 90,
            "inprocessHardTimeout": 120,
            "inprocessBarrierTimeout": 150,
            "ftRankHeartbeatTimeout": 300,
            "ftInitialRankHeartbeatTimeout": 600,
            "metricsPort": free_port(),
            "metricsLinger": 0,  # nobody scrapes here: the default keeps the finished pod up for 60 s
        }
    )
    pod = trainer_pod(render(values, release="ro"))

    port = free_port()
    places = {
        "RDZV_ENDPOINT": f"127.0.0.1:{port}",
        "DATA_PATH": str(fsx / "data" / "tokens.npy"),
        "CHECKPOINT_DIR": str(fsx / "checkpoints" / "ro"),
        "LOCAL_CHECKPOINT_DIR": str(nvme / "checkpoints" / "ro"),
        "OUT_DIR": str(fsx / "runs" / "ro"),
        "HOME": str(scratch),
        **LOCAL_KEY_FILES,
    }
    base_env = {
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "PYTHONPATH": str(tree),
        "TMPDIR": str(scratch),
        "JOB_COMPLETION_INDEX": "0",
        "RO_BASE": str(sandbox),
        "RO_TREE": str(tree),
        "LANG": "C.UTF-8",
    }

    def run(container: Container, timeout: float) -> subprocess.CompletedProcess[str]:
        env = {
            **container.env,
            **{k: v for k, v in places.items() if k in container.env},
            "HOME": str(scratch),
        }
        argv = _sandboxed(container.resolved_argv(env), sandbox, tree)
        return subprocess.run(
            argv,
            env={**env, **base_env},
            cwd=tree,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )

    # The sandbox is real: the tree and everything outside the mounts refuse writes.
    probe = Container(
        "probe", ["sh", "-c", f"touch '{tree}/x' || touch /var/tmp/ro-probe || exit 0; exit 9"], {}
    )
    assert run(probe, 30).returncode == 0
    assert not (tree / "x").exists() and not Path("/var/tmp/ro-probe").exists()

    before = _snapshot(tree)
    for init in pod.init_containers:
        result = run(init, 300)
        assert result.returncode == 0, f"{init.name}: {result.stderr[-3000:]}"
    result = run(pod.trainer, 600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]

    # It trained for real, and wrote only where a pod can.
    out = Path(places["OUT_DIR"])
    assert (out / "summary.json").is_file() and list(out.glob("events.rank*.jsonl"))
    assert any(Path(places["CHECKPOINT_DIR"]).iterdir())
    assert _snapshot(tree) == before
