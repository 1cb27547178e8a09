"""Catalog of the GPU instance types a team may choose, with the hardware facts the stacks derive from.

The figures live in k8s/instance-types.json, the one table the chart also reads (for the GPUs and EFA
devices a pod may request), so infra and chart cannot disagree. They are from the EC2 instance-type
documentation (accelerated computing, EFA and network cards). Everything that depends on the instance type
(EFA interfaces in the launch template, GPUs per pod, EFA devices per pod, the namespace quota ceiling) is
computed from this table, never hard-coded elsewhere.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

INSTANCE_TYPES_FILE = Path(__file__).resolve().parent.parent / "k8s" / "instance-types.json"


@dataclass(frozen=True)
class GpuInstanceType:
    """Hardware facts of one GPU instance type."""

    name: str
    gpus: int
    """NVIDIA GPUs per instance (ranks per pod)."""
    efa_interfaces: int
    """EFA interfaces the instance supports: one per network card."""
    network_cards: int
    nvme_devices: int
    """Local instance-store NVMe SSDs (striped into one RAID0 for the local checkpoint tier)."""
    nvme_gib_each: int


def _load(path: Path) -> dict[str, GpuInstanceType]:
    types = json.loads(path.read_text(encoding="utf-8"))["types"]
    return {
        name: GpuInstanceType(
            name,
            gpus=facts["gpus"],
            efa_interfaces=facts["efaInterfaces"],
            network_cards=facts["networkCards"],
            nvme_devices=facts["nvmeDevices"],
            nvme_gib_each=facts["nvmeGibEach"],
        )
        for name, facts in types.items()
    }


GPU_INSTANCE_TYPES: dict[str, GpuInstanceType] = _load(INSTANCE_TYPES_FILE)

DEFAULT_GPU_INSTANCE_TYPE = "p5.48xlarge"


@dataclass(frozen=True)
class NetworkInterfaceSpec:
    """One launch-template network interface."""

    network_card_index: int
    device_index: int
    interface_type: str  # "efa" (EFA with ENA) or "efa-only"


def efa_interfaces(instance_type: str) -> list[NetworkInterfaceSpec]:
    """The launch template's interfaces for `instance_type`: one EFA per network card.

    Card 0 device 0 is the primary interface, which must carry IP traffic, so it is `efa` (EFA with ENA).
    Every other card gets an `efa-only` interface at device index 1: EFA-only interfaces take no IP
    address, which keeps a 32-interface p5 from eating 32 subnet addresses (AWS's P5 "use case 1").
    """
    spec = GPU_INSTANCE_TYPES[instance_type]
    interfaces = [NetworkInterfaceSpec(0, 0, "efa")]
    interfaces += [NetworkInterfaceSpec(card, 1, "efa-only") for card in range(1, spec.efa_interfaces)]
    return interfaces
