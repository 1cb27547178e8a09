"""The layout's rules, read from the source with `ast` (every import, also those inside functions):
which top-level package may import which (docs/design.md, "Ownership of modules"), that every folder
says what it owns, and that no test module imports another test module."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT

PACKAGES = ("infra", "trainer", "tools", "bench", "goodput")
# What each package must never import (besides itself, any package not listed here may be imported).
FORBIDDEN: dict[str, set[str]] = {
    "infra": {"trainer", "tools", "bench", "goodput"},  # synth needs no torch
    "trainer": {"infra", "tools", "bench", "goodput"},  # the image needs no CDK and no harness
    "tools": {"bench", "infra"},
    "goodput": {"infra", "trainer", "tools", "bench"},
}


def imported_packages(path: Path) -> set[str]:
    """Top-level names of every absolute import in ``path``; relative imports count as the file's own."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def imported_modules(path: Path) -> set[str]:
    """Full dotted names of every absolute import in ``path`` (``from a.b import c`` gives a.b and a.b.c)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def violations(package: str) -> list[str]:
    return [
        f"{path.relative_to(REPO_ROOT)} imports {name}"
        for path in sorted((REPO_ROOT / package).rglob("*.py"))
        for name in sorted(imported_packages(path) & FORBIDDEN[package])
    ]


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_import_rules(package: str) -> None:
    assert violations(package) == []


def test_the_checker_sees_imports_inside_functions(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text("import os\n\ndef f():\n    from bench.recovery import run\n    import trainer.model\n")
    assert imported_packages(source) == {"os", "bench", "trainer"}


def test_app_imports_infra_only_of_the_parts() -> None:
    assert imported_packages(REPO_ROOT / "app.py") & set(PACKAGES) == {"infra"}


def test_no_test_module_imports_another_test_module() -> None:
    offenders = [
        f"{path.relative_to(REPO_ROOT)} imports {name}"
        for path in sorted((REPO_ROOT / "tests").rglob("*.py"))
        for name in sorted(imported_modules(path))
        if name.startswith("tests.") and any(part.startswith("test_") for part in name.split(".")[1:])
    ]
    assert offenders == []


def test_nothing_imports_a_conftest() -> None:
    # conftest.py holds fixtures, which pytest injects; helpers to import live in plain modules.
    offenders = [
        f"{path.relative_to(REPO_ROOT)} imports {name}"
        for path in sorted(REPO_ROOT.glob("[a-z]*/**/*.py"))
        if ".venv" not in path.parts and "node_modules" not in path.parts
        for name in sorted(imported_modules(path))
        if name.split(".")[-1] == "conftest" or ".conftest." in name
    ]
    assert offenders == []


@pytest.mark.parametrize("folder", [*PACKAGES, "tests"])
def test_each_package_opens_with_a_docstring(folder: str) -> None:
    tree = ast.parse((REPO_ROOT / folder / "__init__.py").read_text(encoding="utf-8"))
    doc = ast.get_docstring(tree)
    assert doc and len(doc) > 80, f"{folder}/__init__.py must say what it owns and what it may import"


def test_the_chart_opens_with_a_readme() -> None:
    assert "Owns" in (REPO_ROOT / "k8s" / "README.md").read_text(encoding="utf-8")
