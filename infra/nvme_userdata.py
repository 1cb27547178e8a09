"""Node user data that stripes the instance-store NVMe SSDs into one RAID0 mounted at /mnt/nvme.

The local checkpoint tier writes there (Contract 1: `storage.localNvmePath`). Managed node groups on
AL2023 merge their own nodeadm NodeConfig into a MIME multi-part user data, so this is one shell-script
part; cloud-init runs it before nodeadm starts the kubelet, so pods never see an unmounted path.
"""

from __future__ import annotations

LOCAL_NVME_PATH = "/mnt/nvme"
_BOUNDARY = "==NVRXBOUNDARY=="

# Instance-store disks report this model string; EBS volumes (also NVMe on Nitro) do not.
_SCRIPT = r"""#!/bin/bash
# Stripe every instance-store NVMe SSD into one RAID0 at __MOUNT__ (idempotent across reboots).
set -euo pipefail
MOUNT=__MOUNT__
MD=/dev/md/nvme-ckpt
if mountpoint -q "$MOUNT"; then exit 0; fi
mkdir -p "$MOUNT"
mapfile -t DEVICES < <(lsblk -dpno NAME,MODEL | awk '/Amazon EC2 NVMe Instance Storage/ {print $1}')
if [ "${#DEVICES[@]}" -eq 0 ]; then
  echo "nvme-raid: no instance-store NVMe found; $MOUNT stays on the root volume" >&2
  exit 0
fi
if [ ! -e "$MD" ]; then
  # Instance store is blank after a stop/start: (re)create the array and its file system.
  mdadm --create "$MD" --level=0 --raid-devices="${#DEVICES[@]}" --force --run "${DEVICES[@]}"
  mkfs.xfs -f -L nvme-ckpt "$MD"
fi
mount -o noatime "$MD" "$MOUNT"
chmod 0777 "$MOUNT"
grep -q " $MOUNT " /etc/fstab || echo "$MD $MOUNT xfs noatime,nofail 0 2" >> /etc/fstab
"""


def nvme_raid_script(mount_path: str = LOCAL_NVME_PATH) -> str:
    """The bash script that builds and mounts the RAID0."""
    return _SCRIPT.replace("__MOUNT__", mount_path)


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
