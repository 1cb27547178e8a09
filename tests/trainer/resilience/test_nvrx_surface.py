"""The NVRx surface the trainer stands on is still there in the installed release, pinned where it ships.

Tier 1 stands on `nvidia_resiliency_ext.inprocess.Wrapper`, which NVRx deprecated in 0.6 and still ships in
0.7 (docs/design.md, "Tier 1 when NVRx drops the Wrapper"). A release that drops it, or renames anything
else the trainer imports from NVRx, must fail here by name, not in the middle of a fault run. The names are
read from the trainer's source, so a new use of NVRx is covered without editing this test.
"""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import re
from pathlib import Path

from tests.helpers import REPO_ROOT

NVRX = "nvidia_resiliency_ext"


def _attribute_chain(node: ast.expr) -> list[str] | None:
    """`a.b.c` -> ["a", "b", "c"]; None for anything but a plain dotted name."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id, *reversed(parts)]


def nvrx_names(source: str) -> set[str]:
    """Every dotted NVRx name a module uses: what it imports from NVRx, and the attributes it reads through
    a name bound to an NVRx module (`from nvidia_resiliency_ext import inprocess; inprocess.Wrapper`)."""
    tree = ast.parse(source)
    used: set[str] = set()
    bound: dict[str, str] = {}  # local name -> the NVRx dotted name it stands for
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith(NVRX):
            for alias in node.names:
                used.add(f"{node.module}.{alias.name}")
                bound[alias.asname or alias.name] = f"{node.module}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(NVRX):
                    used.add(alias.name)
                    if alias.asname:
                        bound[alias.asname] = alias.name
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):  # `a.b.c` also walks `a.b`: both must resolve
            chain = _attribute_chain(node)
            if chain and chain[0] in bound:
                used.add(".".join([bound[chain[0]], *chain[1:]]))
    return used


def missing(names: set[str]) -> list[str]:
    """The names that do not resolve in the installed NVRx (longest importable module, then attributes)."""
    absent = []
    for name in sorted(names):
        parts = name.split(".")
        obj = None
        for cut in range(len(parts), 0, -1):
            try:
                obj = importlib.import_module(".".join(parts[:cut]))
            except ImportError:
                continue
            for attr in parts[cut:]:
                obj = getattr(obj, attr, None)
                if obj is None:
                    break
            break
        if obj is None:
            absent.append(name)
    return absent


def trainer_nvrx_names() -> set[str]:
    return {
        name
        for path in sorted((REPO_ROOT / "trainer").rglob("*.py"))
        for name in nvrx_names(path.read_text(encoding="utf-8"))
    }


def test_every_nvrx_name_the_trainer_uses_exists_in_the_installed_release() -> None:
    names = trainer_nvrx_names()
    # The parts tier 1 and tier 2 stand on are among them (the source walk found them).
    assert f"{NVRX}.inprocess.Wrapper" in names
    assert any(name.startswith(f"{NVRX}.fault_tolerance") for name in names)
    assert missing(names) == []


def test_a_name_the_release_lacks_is_reported(tmp_path: Path) -> None:
    source = (
        "from nvidia_resiliency_ext import inprocess\n"
        "from nvidia_resiliency_ext.inprocess import NoSuchWrapper\n"
        "w = inprocess.Wrapper\n"
        "x = inprocess.abort.NoSuchAbort\n"
    )
    names = nvrx_names(source)
    assert {f"{NVRX}.inprocess.Wrapper", f"{NVRX}.inprocess.abort.NoSuchAbort"} <= names
    assert missing(names) == [f"{NVRX}.inprocess.NoSuchWrapper", f"{NVRX}.inprocess.abort.NoSuchAbort"]


def test_the_installed_release_is_the_one_the_makefile_and_the_image_pin() -> None:
    makefile = re.search(r"^NVRX_VERSION\s*:=\s*(\S+)", (REPO_ROOT / "Makefile").read_text(), re.M)
    dockerfile = re.search(r"^ARG NVRX_VERSION=(\S+)", (REPO_ROOT / "Dockerfile").read_text(), re.M)
    assert makefile and dockerfile
    assert makefile.group(1) == dockerfile.group(1) == importlib.metadata.version("nvidia-resiliency-ext")
