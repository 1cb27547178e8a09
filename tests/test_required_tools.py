"""Under `make test` (BLUEPRINT_REQUIRE_TOOLS=1) a test that needs helm or the CDK CLI fails when the tool
is missing; run elsewhere it skips with the reason. Either way it never passes without the tool."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers import REQUIRE_TOOLS_ENV, makefile_recipe, require_tool


def test_missing_tool_fails_under_make_test(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(REQUIRE_TOOLS_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match="helm not installed"):
        require_tool(tmp_path / "helm", "helm")


def test_missing_tool_skips_with_a_reason_outside_make(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(REQUIRE_TOOLS_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match="make setup"):
        require_tool(tmp_path / "cdk", "the CDK CLI")


def test_present_tool_is_returned(tmp_path: Path) -> None:
    tool = tmp_path / "helm"
    tool.write_text("")
    assert require_tool(tool, "helm") == tool


def test_the_makefile_requires_the_tools_for_its_test_targets() -> None:
    for target in ("test", "test-fast"):
        assert f"{REQUIRE_TOOLS_ENV}=1" in makefile_recipe(target), (
            f"make {target} must set {REQUIRE_TOOLS_ENV}=1"
        )
