"""No function in trainer/ is longer than MAX_LINES (read from the source with `ast`): a function a reader
cannot hold at once is split where its steps are (see trainer/recovery/restore.py `restore`)."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.helpers import REPO_ROOT

MAX_LINES = 80
"""From the `def` line to the last line of the body, docstring, comments and nested functions included."""

# Functions still over MAX_LINES, each with the length it had when listed: the list must only shrink
# (a function that grows fails, one split below the limit fails until it is removed from here).
KNOWN_LONG: dict[str, int] = {
    # An attempt's whole life: build, restore, train, teardown (the runtime's; being split there).
    "trainer/runtime/train.py:Trainer.run_iteration": 95,
}


def long_functions(root: Path, folder: str, limit: int = MAX_LINES) -> dict[str, int]:
    """`path:Class.function` -> its length in lines, for every function (methods and nested functions
    too, each on its own) longer than `limit` under `root/folder`."""
    found: dict[str, int] = {}

    def visit(node: ast.AST, path: str, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                name = f"{prefix}{child.name}"
                length = (child.end_lineno or child.lineno) - child.lineno + 1
                if length > limit:
                    found[f"{path}:{name}"] = length
                visit(child, path, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, path, f"{prefix}{child.name}.")
            else:
                visit(child, path, prefix)

    for file in sorted((root / folder).rglob("*.py")):
        visit(ast.parse(file.read_text(encoding="utf-8")), str(file.relative_to(root)), "")
    return found


def test_no_function_in_the_trainer_is_longer_than_the_limit() -> None:
    found = long_functions(REPO_ROOT, "trainer")
    new = {name: n for name, n in found.items() if name not in KNOWN_LONG}
    assert new == {}, f"split these (at most {MAX_LINES} lines each)"
    grown = {name: (KNOWN_LONG[name], n) for name, n in found.items() if n > KNOWN_LONG.get(name, n)}
    assert grown == {}, "listed functions may only shrink: (listed, now)"
    fixed = sorted(set(KNOWN_LONG) - set(found))
    assert fixed == [], f"no longer over {MAX_LINES} lines (or gone): remove {fixed} from KNOWN_LONG"


def test_the_length_checker_sees_methods_and_nested_functions(tmp_path: Path) -> None:
    body = "".join(f"    x{i} = {i}\n" for i in range(5))
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text(
        f"def short():\n{body}\n"
        f"class C:\n    def method(self):\n{body.replace('    ', '        ')}"
        f"        def inner():\n{body.replace('    ', '            ')}"
        f"async def coro():\n{body}{body}"
    )
    assert long_functions(tmp_path, "pkg", limit=6) == {"pkg/m.py:C.method": 12, "pkg/m.py:coro": 11}
    assert long_functions(tmp_path, "pkg", limit=5) == {
        "pkg/m.py:short": 6,
        "pkg/m.py:C.method": 12,
        "pkg/m.py:C.method.inner": 6,
        "pkg/m.py:coro": 11,
    }
