"""The instance-type catalog and the EFA interface layout derived from it."""

from __future__ import annotations

import pytest

from infra.instance_types import GPU_INSTANCE_TYPES, efa_interfaces


@pytest.mark.parametrize(
    ("name", "efa", "nvme_devices"),
    [("p5.48xlarge", 32, 8), ("p5e.48xlarge", 32, 8), ("p5en.48xlarge", 16, 8), ("p4d.24xlarge", 4, 8)],
)
def test_catalog_facts(name: str, efa: int, nvme_devices: int) -> None:
    spec = GPU_INSTANCE_TYPES[name]
    assert (spec.gpus, spec.efa_interfaces, spec.nvme_devices) == (8, efa, nvme_devices)
    assert spec.network_cards >= spec.efa_interfaces  # one EFA per network card at most


@pytest.mark.parametrize("name", sorted(GPU_INSTANCE_TYPES))
def test_one_interface_per_card_primary_efa_rest_efa_only(name: str) -> None:
    interfaces = efa_interfaces(name)
    assert len(interfaces) == GPU_INSTANCE_TYPES[name].efa_interfaces
    assert [i.network_card_index for i in interfaces] == list(range(len(interfaces)))
    assert (interfaces[0].device_index, interfaces[0].interface_type) == (0, "efa")
    assert all((i.device_index, i.interface_type) == (1, "efa-only") for i in interfaces[1:])


def test_unknown_type_is_a_key_error() -> None:
    with pytest.raises(KeyError):
        efa_interfaces("p3.16xlarge")
