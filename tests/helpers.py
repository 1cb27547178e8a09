"""Helpers every test folder imports: the repository root, free ports, the tools `make setup` installs
(helm, CDK CLI, checkov) and `require_tool`, which fails or skips when one is missing. Fixtures:
conftest.py."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from trainer.runtime.ports import free_port

REPO_ROOT = Path(__file__).resolve().parent.parent
HELM = REPO_ROOT / ".tools" / "bin" / "helm"
CDK = REPO_ROOT / "node_modules" / ".bin" / "cdk"
CHECKOV = REPO_ROOT / ".tools" / "checkov" / "bin" / "checkov"  # its own venv (Makefile CHECKOV_VENV)
# `make test` sets it: there a missing tool is a failure (make setup installed it), never a skip.
REQUIRE_TOOLS_ENV = "BLUEPRINT_REQUIRE_TOOLS"

__all__ = ["CDK", "CHECKOV", "HELM", "REPO_ROOT", "REQUIRE_TOOLS_ENV", "free_port", "require_tool"]


def require_tool(path: Path, what: str) -> Path:
    """``path`` if it exists; else fail under ``make test`` (BLUEPRINT_REQUIRE_TOOLS=1), skip elsewhere."""
    if path.exists():
        return path
    message = f"{what} not installed at {path} (`make setup` installs it)"
    if os.environ.get(REQUIRE_TOOLS_ENV) == "1":
        pytest.fail(f"{message}; {REQUIRE_TOOLS_ENV}=1 requires it")
    pytest.skip(message)


def makefile_recipe(target: str) -> str:
    """The recipe of `target` in the repository's Makefile, up to the next blank line."""
    makefile = (REPO_ROOT / "Makefile").read_text()
    return makefile.split(f"\n{target}:", 1)[1].split("\n\n", 1)[0]
