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


# Subpackages of trainer/ that import each other (in any file, at any depth, also inside a function or
# under `if TYPE_CHECKING:`): a pair is a layering question left open, since neither sits below the
# other. Pairs tolerated for now, each sorted; the list must only shrink (a pair that is no longer mutual
# fails below until it is removed).
KNOWN_MUTUAL_SUBPACKAGES: set[tuple[str, str]] = {
    # The api's Job calls the runtime's session and failures; the runtime builds the Job (moving the Job's
    # implementation into the runtime ends it).
    ("api", "runtime"),
    # TrainConfig composes each component's config (checkpoint/config.py, snapshot/config.py,
    # resilience/timeouts.py, the runtime's fault specs), and those components import config/'s errors
    # and settings mechanism.
    ("checkpoint", "config"),
    ("config", "resilience"),
    ("config", "runtime"),
    ("config", "snapshot"),
}


def subpackage_imports(root: Path) -> dict[tuple[str, str], set[str]]:
    """(importing subpackage, imported subpackage) of trainer/ -> the importing files."""
    edges: dict[tuple[str, str], set[str]] = {}
    subpackages = {p.parent.name for p in (root / "trainer").glob("*/__init__.py")}
    for path in sorted((root / "trainer").rglob("*.py")):
        parts = path.relative_to(root / "trainer").parts
        if len(parts) < 2:
            continue  # trainer/__init__.py, trainer/__main__.py: the top, above every subpackage
        for name in imported_modules(path):
            dotted = name.split(".")
            if dotted[0] == "trainer" and len(dotted) > 1 and dotted[1] in subpackages - {parts[0]}:
                edges.setdefault((parts[0], dotted[1]), set()).add(str(path.relative_to(root)))
    return edges


def mutual_subpackages(root: Path) -> dict[tuple[str, str], str]:
    """Each sorted pair of trainer subpackages that import each other, with a file on each side."""
    edges = subpackage_imports(root)
    return {
        (a, b): f"{sorted(edges[(a, b)])[0]} imports {b}; {sorted(edges[(b, a)])[0]} imports {a}"
        for a, b in edges
        if a < b and (b, a) in edges
    }


def test_no_two_trainer_subpackages_import_each_other() -> None:
    mutual = mutual_subpackages(REPO_ROOT)
    assert {pair: why for pair, why in mutual.items() if pair not in KNOWN_MUTUAL_SUBPACKAGES} == {}
    fixed = sorted(KNOWN_MUTUAL_SUBPACKAGES - set(mutual))
    assert fixed == [], f"no longer mutual: remove {fixed} from KNOWN_MUTUAL_SUBPACKAGES"


# The restore tiers in layers (docs/design.md): state/ below, checkpoint/ and snapshot/ side by side,
# recovery/ above both. What each may not import, not even one way.
TIER_LAYERS: dict[str, set[str]] = {
    "checkpoint": {"snapshot", "recovery"},
    "snapshot": {"checkpoint", "recovery"},
}


def test_the_restore_tiers_are_layered() -> None:
    edges = subpackage_imports(REPO_ROOT)
    subpackages = {p.parent.name for p in (REPO_ROOT / "trainer").glob("*/__init__.py")}
    never = {**TIER_LAYERS, "state": subpackages - {"state"}}  # state/ imports no other subpackage
    upward = {pair: sorted(files) for pair, files in edges.items() if pair[1] in never.get(pair[0], set())}
    assert upward == {}


def test_the_subpackage_checker_finds_a_pair_through_lazy_and_type_only_imports(tmp_path: Path) -> None:
    for sub in ("low", "high", "side"):
        (tmp_path / "trainer" / sub).mkdir(parents=True)
        (tmp_path / "trainer" / sub / "__init__.py").write_text("")
    (tmp_path / "trainer" / "__init__.py").write_text("from trainer.low import a\n")  # the top: not a pair
    (tmp_path / "trainer" / "high" / "a.py").write_text("from trainer.low.b import x\n")
    (tmp_path / "trainer" / "low" / "b.py").write_text("def f():\n    import trainer.high.a\nx = 1\n")
    (tmp_path / "trainer" / "side" / "c.py").write_text(
        "import typing\nif typing.TYPE_CHECKING:\n    from trainer import low\n"
    )
    assert set(mutual_subpackages(tmp_path)) == {("high", "low")}
    # side imports low only for type checking: that counts
    (tmp_path / "trainer" / "low" / "d.py").write_text("from trainer.side import c\n")
    assert set(mutual_subpackages(tmp_path)) == {("high", "low"), ("low", "side")}


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
