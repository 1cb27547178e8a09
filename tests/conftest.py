"""Shared fixtures: free ports, the repository root, the tools `make setup` installs (helm, CDK CLI)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tools.ports import free_port

# Every test fails when a process it started outlives it detached from the runner (tests/orphans.py).
pytest_plugins = ["tests.orphans"]

REPO_ROOT = Path(__file__).resolve().parent.parent
HELM = REPO_ROOT / ".tools" / "bin" / "helm"
CDK = REPO_ROOT / "node_modules" / ".bin" / "cdk"
# `make test` sets it: there a missing tool is a failure (make setup installed it), never a skip.
REQUIRE_TOOLS_ENV = "BLUEPRINT_REQUIRE_TOOLS"

__all__ = ["CDK", "HELM", "REPO_ROOT", "REQUIRE_TOOLS_ENV", "free_port", "require_tool"]


@pytest.fixture
def repo_root() -> Path:
    return REPO_ROOT


def require_tool(path: Path, what: str) -> Path:
    """``path`` if it exists; else fail under ``make test`` (BLUEPRINT_REQUIRE_TOOLS=1), skip elsewhere."""
    if path.exists():
        return path
    message = f"{what} not installed at {path} (`make setup` installs it)"
    if os.environ.get(REQUIRE_TOOLS_ENV) == "1":
        pytest.fail(f"{message}; {REQUIRE_TOOLS_ENV}=1 requires it")
    pytest.skip(message)


@pytest.fixture
def helm_bin() -> Path:
    """The project's helm binary (.tools/bin/helm)."""
    return require_tool(HELM, "helm")


@pytest.fixture
def cdk_cli() -> Path:
    """The CDK CLI (node_modules/.bin/cdk)."""
    return require_tool(CDK, "the CDK CLI")
