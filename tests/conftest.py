"""Fixtures for the whole suite: the repository root, the tools `make setup` installs (helm, CDK CLI) and
the session's control plane (`make controlplane`).
Importable helpers live in tests/helpers.py; nothing imports a conftest."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from tests.helpers import CDK, HELM, REPO_ROOT, REQUIRE_TOOLS_ENV, require_tool
from tools.controlplane.launch import (
    ControlPlane,
    ControlPlaneError,
    binaries,
    running_control_plane,
)

# Every test fails when a process it started outlives it detached from the runner (tests/orphans.py);
# under make test's xdist workers, tests are scheduled in groups (tests/groups.py).
pytest_plugins = ["tests.orphans", "tests.groups", "tests.helper_servers"]

# Generated tests draw the same examples on every run (a seed per test): a red CI names a real input, never
# an unlucky draw, and nothing is written into the tree (no example database).
settings.register_profile("blueprint", derandomize=True, database=None)
settings.load_profile("blueprint")


@pytest.fixture
def repo_root() -> Path:
    return REPO_ROOT


@pytest.fixture
def helm_bin() -> Path:
    """The project's helm binary (.tools/bin/helm)."""
    return require_tool(HELM, "helm")


@pytest.fixture
def cdk_cli() -> Path:
    """The CDK CLI (node_modules/.bin/cdk)."""
    return require_tool(CDK, "the CDK CLI")


@pytest.fixture
def alarm() -> Iterator[None]:
    """Fail (instead of hanging the suite) when the code under test blocks or runs away: a FIFO read, an
    alias bomb walked. 10 s of wall time, by SIGALRM in the main thread."""

    def timed_out(*_: object) -> None:
        raise TimeoutError("the check blocked or ran away")

    old = signal.signal(signal.SIGALRM, timed_out)
    signal.alarm(10)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """One real control plane (etcd, kube-apiserver, controller manager, scheduler; tools/controlplane)
    for the whole session: every test module that uses it is scheduled on one xdist worker
    (tests/groups.py), so it starts once. Tests give their objects a namespace of their own."""
    try:
        binaries()
    except ControlPlaneError as missing:
        if os.environ.get(REQUIRE_TOOLS_ENV) == "1":
            pytest.fail(f"{missing}; {REQUIRE_TOOLS_ENV}=1 requires it", pytrace=False)
        pytest.skip(str(missing))
    with contextlib.ExitStack() as running:
        plane = running.enter_context(running_control_plane(tmp_path_factory.mktemp("controlplane")))
        _RUNNING_PLANES.append(running)
        yield plane


_RUNNING_PLANES: list[contextlib.ExitStack] = []


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Stop the control plane after the last test of its group (tests/groups.py) rather than at the
    session's end: idle it still takes about a tenth of a core (6.4 CPU-s a minute here), which the other
    worker's tests lost for the rest of the session."""
    from tests.groups import CLUSTER, ends_group  # a plugin of this file's: imported after its registration

    if _RUNNING_PLANES and ends_group(item, nextitem, CLUSTER):
        _RUNNING_PLANES.pop().close()
