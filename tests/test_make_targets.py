"""The Makefile's pytest targets select what their help says: a `-m` on the command line replaces the
`-m 'not soak'` of pyproject's addopts (pytest keeps the last one), so a target that narrows the suite
must keep the soak runs out itself. `make test-fast` once ran the soak tests (the cluster demo, the
vanished node's 40 s quarantine): 9 minutes instead of under 5."""

from __future__ import annotations

import re
import shlex

import pytest
from _pytest.mark.expression import Expression

from tests.helpers import REPO_ROOT, makefile_recipe


def _marker_expression(target: str) -> str | None:
    """The last `-m EXPR` of the target's pytest command, or None when it passes none."""
    (command,) = [line for line in makefile_recipe(target).splitlines() if "-m pytest" in line]
    args = shlex.split(command.split("-m pytest", 1)[1])
    found = [args[i + 1] for i, arg in enumerate(args[:-1]) if arg == "-m"]
    return found[-1] if found else None


def _selects(expression: str, *markers: str) -> bool:
    return Expression.compile(expression).evaluate(lambda name: name in markers)


def _addopts_expression() -> str:
    pyproject = (REPO_ROOT / "pyproject.toml").read_text()
    match = re.search(r"""^addopts = ".*-m '([^']+)'""", pyproject, re.M)
    assert match, "pyproject's addopts keep the soak runs out with -m"
    return match.group(1)


@pytest.mark.parametrize(
    ("target", "slow_runs"),
    [("test", True), ("test-fast", False)],
)
def test_no_test_target_runs_the_soak_tests(target: str, slow_runs: bool) -> None:
    expression = _marker_expression(target) or _addopts_expression()
    assert not _selects(expression, "soak"), f"make {target} selects soak tests with -m {expression!r}"
    assert not _selects(expression, "soak", "slow"), f"make {target} selects slow soak tests"
    assert _selects(expression), f"make {target} leaves out the unmarked tests"
    assert _selects(expression, "slow") is slow_runs, (
        f"make {target}: slow tests {'in' if slow_runs else 'out'}"
    )


def test_make_soak_runs_the_soak_tests() -> None:
    expression = _marker_expression("soak")
    assert expression is not None and _selects(expression, "soak")
