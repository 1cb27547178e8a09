"""The GPU node's NVMe script, run under bash in a scratch root with fake device tools: it fails
loudly instead of falling back to the root volume, and the kubelet never starts without the RAID."""

from __future__ import annotations

import os
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from infra.nvme_userdata import KUBELET_GUARD, LOCAL_NVME_PATH, nvme_raid_script

INSTANCE_STORE = "Amazon EC2 NVMe Instance Storage"
EBS = "Amazon Elastic Block Store"

# Each fake logs its argv to $FAKE_LOG; lsblk prints $FAKE_LSBLK; mountpoint answers from $FAKE_MOUNTED;
# a tool named in $FAKE_FAIL exits 1.
_FAKE = """#!/bin/bash
name=$(basename "$0")
echo "$name $*" >> "$FAKE_LOG"
case " $FAKE_FAIL " in *" $name "*) exit 1 ;; esac
case "$name" in
  lsblk) printf '%s' "$FAKE_LSBLK" ;;
  mountpoint) [ "$FAKE_MOUNTED" = 1 ] ;;
esac
"""
TOOLS = ["lsblk", "mdadm", "mkfs.xfs", "mount", "mountpoint", "systemctl", "chmod"]


@dataclass
class Run:
    returncode: int
    stderr: str
    calls: list[str]
    root: Path

    def called(self, tool: str) -> list[str]:
        return [c for c in self.calls if c.split(" ", 1)[0] == tool]


def _run(tmp_path: Path, lsblk: str, *, mounted: bool = False, fail: str = "") -> Run:
    bin_dir, root = tmp_path / "bin", tmp_path / "root"
    bin_dir.mkdir()
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "fstab").write_text("UUID=abc / xfs defaults 0 1\n")
    for tool in TOOLS:
        path = bin_dir / tool
        path.write_text(_FAKE)
        path.chmod(path.stat().st_mode | stat.S_IXUSR)
    log = tmp_path / "calls.log"
    log.touch()
    env = {
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "NVME_SETUP_ROOT": str(root),
        "FAKE_LOG": str(log),
        "FAKE_LSBLK": lsblk,
        "FAKE_MOUNTED": "1" if mounted else "0",
        "FAKE_FAIL": fail,
    }
    done = subprocess.run(
        ["bash", "-c", nvme_raid_script()], env=env, text=True, capture_output=True, timeout=30, check=False
    )
    return Run(done.returncode, done.stderr, log.read_text().splitlines(), root)


def _guard(run: Run) -> str:
    return (run.root / KUBELET_GUARD.lstrip("/")).read_text()


def test_two_instance_store_disks_become_one_raid0_mounted_with_the_kubelet_guarded(tmp_path: Path) -> None:
    lsblk = f"/dev/nvme0n1 {EBS}\n/dev/nvme1n1 {INSTANCE_STORE}\n/dev/nvme2n1 {INSTANCE_STORE}\n"
    run = _run(tmp_path, lsblk)
    assert run.returncode == 0, run.stderr
    (create,) = run.called("mdadm")
    assert "--level=0 --raid-devices=2" in create and create.endswith("/dev/nvme1n1 /dev/nvme2n1")
    assert run.called("mount") == [f"mount -o noatime /dev/md/nvme-ckpt {LOCAL_NVME_PATH}"]
    assert (run.root / LOCAL_NVME_PATH.lstrip("/")).is_dir()
    assert f"/dev/md/nvme-ckpt {LOCAL_NVME_PATH} xfs" in (run.root / "etc/fstab").read_text()
    assert f"ExecStartPre=/bin/sh -c 'mountpoint -q {LOCAL_NVME_PATH} ||" in _guard(run)
    # The guard is installed (and systemd reloaded) before any device is looked at.
    tools = [c.split(" ", 1)[0] for c in run.calls]
    assert tools.index("systemctl") < tools.index("lsblk")


def test_no_instance_store_fails_loudly_and_creates_nothing_on_the_root_volume(tmp_path: Path) -> None:
    run = _run(tmp_path, f"/dev/nvme0n1 {EBS}\n")
    assert run.returncode == 1
    assert "nvme-raid: FATAL: no instance-store NVMe device found" in run.stderr
    assert "kubelet will not start" in run.stderr
    assert not (run.root / LOCAL_NVME_PATH.lstrip("/")).exists()  # no directory for a hostPath to use
    assert run.called("mdadm") == [] and run.called("mount") == []
    assert (run.root / "etc/fstab").read_text() == "UUID=abc / xfs defaults 0 1\n"
    assert LOCAL_NVME_PATH in _guard(run)  # the node never runs pods


@pytest.mark.parametrize(("tool", "message"), [("mdadm", "mdadm could not build"), ("mount", "mount of")])
def test_a_failing_array_or_mount_stops_the_script_with_its_reason(
    tmp_path: Path, tool: str, message: str
) -> None:
    run = _run(tmp_path, f"/dev/nvme1n1 {INSTANCE_STORE}\n", fail=tool)
    assert run.returncode == 1 and f"nvme-raid: FATAL: {message}" in run.stderr
    assert "nvme-ckpt" not in (run.root / "etc/fstab").read_text()
    assert LOCAL_NVME_PATH in _guard(run)


def test_an_already_mounted_tier_is_left_alone(tmp_path: Path) -> None:
    run = _run(tmp_path, f"/dev/nvme1n1 {INSTANCE_STORE}\n", mounted=True)
    assert run.returncode == 0
    assert run.called("lsblk") == [] and run.called("mdadm") == [] and run.called("mount") == []
