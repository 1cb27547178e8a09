"""A process kubelet per test module over the session's control plane (tests/clusterkit.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.clusterkit import Cluster, kubelet_cluster
from tools.controlplane.launch import ControlPlane


@pytest.fixture(scope="module")
def cluster(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with kubelet_cluster(control_plane, tmp_path_factory.mktemp("nodes")) as cl:
        yield cl
