"""Fixtures for the whole suite: the repository root and the tools `make setup` installs (helm, CDK CLI).
Importable helpers live in tests/helpers.py; nothing imports a conftest."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from tests.helpers import CDK, HELM, REPO_ROOT, require_tool

# Every test fails when a process it started outlives it detached from the runner (tests/orphans.py).
pytest_plugins = ["tests.orphans"]

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


# `make test` runs two xdist workers (`--dist loadgroup`, pyproject.toml). Each test gets a group, so that
# a module's (or the session's) shared run or synth is started once, on one worker:
# - HEAVY: every module with a multi-process training run (a `slow` test, or one reading the session's
#   shared runs). They run one after another on one worker, never two at once: their timeouts are sized
#   for one run on a loaded 2-core machine, not for two runs competing;
# - INFRA: the infra tests, which read one synth of the app per session (tests/infra/conftest.py);
# - every other module is its own group: the other worker takes them while HEAVY runs.
HEAVY = "heavy"
SHARED_RUNS = frozenset({"clean_run", "faulty_run"})


def xdist_group_of(item: pytest.Item, heavy_modules: set[str]) -> str:
    module = item.nodeid.split("::", 1)[0]
    if module in heavy_modules:
        return HEAVY
    if module.startswith("tests/infra/"):
        return "infra"
    return module


def _is_heavy(item: pytest.Item) -> bool:
    return item.get_closest_marker("slow") is not None or bool(
        SHARED_RUNS & set(getattr(item, "fixturenames", ()))
    )


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    heavy_modules = {item.nodeid.split("::", 1)[0] for item in items if _is_heavy(item)}
    for item in items:
        item.add_marker(pytest.mark.xdist_group(xdist_group_of(item, heavy_modules)))
