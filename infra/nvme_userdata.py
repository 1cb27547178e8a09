"""Node user data that stripes the instance-store NVMe SSDs into one RAID0 mounted at /mnt/nvme.

The local checkpoint tier writes there (Contract 1: `storage.localNvmePath`). Managed node groups on
AL2023 merge their own nodeadm NodeConfig into a MIME multi-part user data, so this is one shell-script
part; cloud-init runs it before nodeadm starts the kubelet.

No fallback to the root volume: the script first installs a kubelet drop-in whose ExecStartPre refuses to
start the kubelet unless the RAID is mounted at the path, then looks for the devices. A node without
instance-store NVMe, or whose array or mount fails (at first boot or any later boot), never runs the
kubelet: it stays NotReady (the managed node group reports it as failing to join, node auto repair
replaces it) and the reason is in the console output and `journalctl -u kubelet`. The chart's hostPath
(type Directory) never sees a directory on the root volume, because the script creates the mount point only
once the array exists, and no pod runs on a node whose kubelet did not start.
"""

from __future__ import annotations

LOCAL_NVME_PATH = "/mnt/nvme"
KUBELET_GUARD = "/etc/systemd/system/kubelet.service.d/10-nvme-checkpoint-tier.conf"
_BOUNDARY = "==NVRXBOUNDARY=="

# Instance-store disks report this model string; EBS volumes (also NVMe on Nitro) do not.
# NVME_SETUP_ROOT prefixes the files the script writes (empty on a node): tests run it in a scratch root.
_SCRIPT = r"""#!/bin/bash
# Stripe every instance-store NVMe SSD into one RAID0 at __MOUNT__; the kubelet starts only once it is there.
set -euo pipefail
MOUNT=__MOUNT__
MD=/dev/md/nvme-ckpt
ROOT="${NVME_SETUP_ROOT:-}"
fail() {
  # cloud-init copies stderr to the console output (EC2 get-console-output) and cloud-init-output.log.
  echo "nvme-raid: FATAL: $*; the kubelet will not start on this node (no root-volume fallback)" >&2
  exit 1
}
# 1. The guard first, so that any failure below leaves a node that never runs pods.
GUARD="$ROOT__GUARD__"
mkdir -p "$(dirname "$GUARD")"
cat > "$GUARD" <<EOF
[Unit]
After=local-fs.target
[Service]
ExecStartPre=/bin/sh -c 'mountpoint -q $MOUNT || { echo "kubelet: $MOUNT not mounted" >&2; exit 1; }'
EOF
systemctl daemon-reload || true
if mountpoint -q "$MOUNT"; then exit 0; fi
# 2. The devices, before anything is created at the mount point.
mapfile -t DEVICES < <(lsblk -dpno NAME,MODEL | awk '/Amazon EC2 NVMe Instance Storage/ {print $1}')
if [ "${#DEVICES[@]}" -eq 0 ]; then
  fail "no instance-store NVMe device found (lsblk lists none with model 'Amazon EC2 NVMe Instance Storage')"
fi
if [ ! -e "$MD" ]; then
  # Instance store is blank after a stop/start: (re)create the array and its file system.
  mdadm --create "$MD" --level=0 --raid-devices="${#DEVICES[@]}" --force --run "${DEVICES[@]}" \
    || fail "mdadm could not build the RAID0 from ${DEVICES[*]}"
  mkfs.xfs -f -L nvme-ckpt "$MD" || fail "mkfs.xfs failed on $MD"
fi
mkdir -p "$ROOT$MOUNT"
mount -o noatime "$MD" "$MOUNT" || fail "mount of $MD at $MOUNT failed"
chmod 0777 "$ROOT$MOUNT"
# nofail keeps a later boot going when the blank array is missing (so the node stays reachable for
# debugging); the kubelet guard above is what keeps such a node from running pods.
grep -q " $MOUNT " "$ROOT/etc/fstab" || echo "$MD $MOUNT xfs noatime,nofail 0 2" >> "$ROOT/etc/fstab"
echo "nvme-raid: ${#DEVICES[@]} device(s) striped into $MD, mounted at $MOUNT"
"""


def nvme_raid_script(mount_path: str = LOCAL_NVME_PATH) -> str:
    """The bash script that builds and mounts the RAID0 and guards the kubelet on it."""
    return _SCRIPT.replace("__MOUNT__", mount_path).replace("__GUARD__", KUBELET_GUARD)


def nvme_raid_user_data(mount_path: str = LOCAL_NVME_PATH) -> str:
    """The launch template's user data: MIME multi-part (required by EKS managed node groups)."""
    return (
        "MIME-Version: 1.0\n"
        f'Content-Type: multipart/mixed; boundary="{_BOUNDARY}"\n\n'
        f"--{_BOUNDARY}\n"
        'Content-Type: text/x-shellscript; charset="us-ascii"\n\n'
        f"{nvme_raid_script(mount_path)}\n"
        f"--{_BOUNDARY}--\n"
    )
