"""The layout's rules, read from the source with `ast` (every import, also those inside functions):
which top-level package may import which (docs/design.md, "Ownership of modules"), that every folder
says what it owns, that no test module imports another test module and nothing imports a conftest, that
tests/trainer/ mirrors trainer/, and that no two files import each other (no import cycles)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT

PACKAGES = ("infra", "trainer", "tools", "bench", "goodput", "sizing", "examples")
# What each package must never import (besides itself, any package not listed here may be imported).
FORBIDDEN: dict[str, set[str]] = {
    "infra": {"trainer", "tools", "bench", "goodput"},  # synth needs no torch
    "trainer": {"infra", "tools", "bench", "goodput", "sizing"},  # the image needs no CDK and no harness
    "tools": {"bench", "infra"},
    "goodput": {"infra", "trainer", "tools", "bench"},
    # The storage sizing: stdlib only; infra, goodput and tools import it, it imports none of them.
    "sizing": {"infra", "trainer", "tools", "bench", "goodput"},
    # A team's training code: the trainer's public API only (checked below), no harness.
    "examples": {"infra", "tools", "bench", "goodput", "sizing"},
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
    source.write_text(
        "import os\n\ndef f():\n    from bench.recovery import run\n    import trainer.reference.model\n"
    )
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


def test_trainer_tests_mirror_the_trainer_packages() -> None:
    # tests/trainer/<sub>/ exists only for a trainer subpackage, and each is a package of its own.
    trainer_tests = REPO_ROOT / "tests" / "trainer"
    folders = {p.name for p in trainer_tests.iterdir() if p.is_dir() and p.name != "__pycache__"}
    subpackages = {p.parent.name for p in (REPO_ROOT / "trainer").glob("*/__init__.py")}
    assert folders and folders <= subpackages, (
        f"test folders without a trainer package: {folders - subpackages}"
    )
    assert all((trainer_tests / name / "__init__.py").exists() for name in folders)


# Import cycles between the project's files: every import (at module level, under `if TYPE_CHECKING:`, or
# inside a function) is an edge from the importing file to the file of the module it names. Hiding one
# import of a pair in a function only moves the cycle to run time, so it counts too.
CYCLE_ROOTS = (*PACKAGES, "tests")
# Cycles tolerated for now, each a set of files; keep it empty.
KNOWN_CYCLES: list[set[str]] = []


def module_file(root: Path, module: str) -> Path | None:
    """The file of a dotted module name under ``root`` (a module or a package's __init__), if any."""
    base = root.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def imported_files(root: Path, path: Path) -> set[Path]:
    """The project files ``path`` imports (absolute and relative imports, anywhere in the file)."""
    package = list(path.relative_to(root).parts[:-1])  # where a relative import starts (an __init__'s own)
    found: set[Path] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, *([node.module] if node.module else [])])
            # `from pkg import name` imports the submodule pkg.name if there is one, else pkg itself.
            targets = [
                f"{module}.{alias.name}" if module_file(root, f"{module}.{alias.name}") else module
                for alias in node.names
            ]
        else:
            continue
        found.update(f for t in targets if t and (f := module_file(root, t)) is not None and f != path)
    return found


def import_cycles(root: Path, folders: tuple[str, ...]) -> list[set[str]]:
    """Each set of files that import each other at module level, directly or round a longer loop
    (the strongly connected components of the import graph with more than one file)."""
    files = sorted(f for folder in folders for f in (root / folder).rglob("*.py"))
    graph = {f: imported_files(root, f) for f in files}
    index: dict[Path, int] = {}
    low: dict[Path, int] = {}
    stack: list[Path] = []
    cycles: list[set[str]] = []

    def connect(node: Path) -> None:  # Tarjan's algorithm; the graph is a few hundred files
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, ()):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append({str(m.relative_to(root)) for m in component})

    for f in files:
        if f not in index:
            connect(f)
    return cycles


def test_no_two_files_import_each_other() -> None:
    cycles = import_cycles(REPO_ROOT, CYCLE_ROOTS)
    assert [c for c in cycles if c not in KNOWN_CYCLES] == []
    fixed = [c for c in KNOWN_CYCLES if c not in cycles]
    assert fixed == [], f"no longer a cycle: remove {fixed} from KNOWN_CYCLES"


def test_the_cycle_checker_finds_direct_relative_lazy_and_longer_cycles(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from pkg.b import x\n")
    (pkg / "b.py").write_text("import typing\nif typing.TYPE_CHECKING:\n    from pkg import a\nx = 1\n")
    (pkg / "sub" / "c.py").write_text("from . import d\n")
    (pkg / "sub" / "d.py").write_text("from ..e import y\n")
    (pkg / "e.py").write_text("from pkg.sub.c import z\n")
    (pkg / "late.py").write_text("def f():\n    from pkg import lazy\n")
    (pkg / "lazy.py").write_text("from pkg import late\n")
    (pkg / "alone.py").write_text("from pkg import a, sub\nimport os\n")  # imports, is imported by none
    cycles = import_cycles(tmp_path, ("pkg",))
    assert sorted(sorted(c) for c in cycles) == [
        ["pkg/a.py", "pkg/b.py"],
        ["pkg/e.py", "pkg/sub/c.py", "pkg/sub/d.py"],
        ["pkg/late.py", "pkg/lazy.py"],
    ]


@pytest.mark.parametrize("folder", [*PACKAGES, "tests"])
def test_each_package_opens_with_a_docstring(folder: str) -> None:
    tree = ast.parse((REPO_ROOT / folder / "__init__.py").read_text(encoding="utf-8"))
    doc = ast.get_docstring(tree)
    assert doc and len(doc) > 80, f"{folder}/__init__.py must say what it owns and what it may import"


def test_the_chart_opens_with_a_readme() -> None:
    assert "Owns" in (REPO_ROOT / "k8s" / "README.md").read_text(encoding="utf-8")


# Inside trainer/: packages the public API sits below (the runtime implements `Job` and imports the api;
# the reference model and the launcher are users of both). `api.main` starts the runtime: that one import.
API_ABOVE = ("trainer.runtime", "trainer.reference", "trainer.launcher")
API_STARTS_THE_RUNTIME = {("trainer/api/entry.py", "trainer.runtime.entry")}


def _trainer_imports(folder: str, banned: tuple[str, ...]) -> set[tuple[str, str]]:
    """(file, module) for every import under trainer/<folder>/ of a module in one of `banned`."""
    return {
        (str(path.relative_to(REPO_ROOT)), name)
        for path in sorted((REPO_ROOT / "trainer" / folder).rglob("*.py"))
        for name in imported_modules(path)
        if any(name == b or name.startswith(b + ".") for b in banned)
    }


def test_the_api_imports_nothing_above_itself() -> None:
    found = _trainer_imports("api", API_ABOVE)
    allowed = {
        (path, name)
        for path, name in found
        for where, module in API_STARTS_THE_RUNTIME
        if path == where and (name == module or name.startswith(module + "."))
    }
    assert found - allowed == set()
    assert allowed, "api.main no longer starts the runtime: update API_STARTS_THE_RUNTIME"


def test_the_library_config_imports_nothing_of_the_reference_model() -> None:
    # The model, its data and its optimizer are the training function's (trainer/reference/config.py).
    assert _trainer_imports("config", ("trainer.reference",)) == set()


def test_examples_use_only_the_public_api() -> None:
    # A team's code (examples/) reaches the library through trainer.api and its stable names alone.
    from trainer import api

    allowed = {"trainer", "trainer.api", *(f"trainer.api.{name}" for name in api.__all__)}
    used = [
        f"{path.relative_to(REPO_ROOT)} imports {name}"
        for path in sorted((REPO_ROOT / "examples").rglob("*.py"))
        for name in sorted(imported_modules(path))
        if name.split(".")[0] == "trainer" and name not in allowed
    ]
    assert used == []
    assert any("trainer.api" in imported_modules(p) for p in (REPO_ROOT / "examples").rglob("*.py"))
