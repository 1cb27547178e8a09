"""app.py as the CDK CLI and users run it: context handling, one-line errors, one template per team."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT


def _run_app(tmp_path: Path, context: dict) -> subprocess.CompletedProcess[str]:
    """Run app.py the way the cdk CLI does (context and output folder through the environment)."""
    env = dict(
        os.environ,
        CDK_OUTDIR=str(tmp_path / "out"),
        CDK_CONTEXT_JSON=json.dumps(context),
        JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION="20",
    )
    return subprocess.run(
        [sys.executable, "app.py"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (None, "teams file not found"),
        ("teams: [\n", "invalid YAML at line"),
        ("teams:\n  - name: Bad_Name\n", "teams[0].name: 'Bad_Name' is not a DNS-1123 label"),
    ],
)
def test_bad_teams_file_exits_non_zero_with_one_line(
    tmp_path: Path, content: str | None, expected: str
) -> None:
    path = tmp_path / "teams.yaml"
    if content is not None:
        path.write_text(content)
    run = _run_app(tmp_path, {"teams_file": str(path)})
    assert run.returncode == 2
    lines = [ln for ln in run.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and expected in lines[0], run.stderr
    assert "Traceback" not in run.stderr


def test_unknown_team_in_context(tmp_path: Path) -> None:
    run = _run_app(tmp_path, {"teams_file": str(REPO_ROOT / "teams.yaml"), "team": "nope"})
    assert run.returncode == 2
    assert run.stderr.strip() == "error: team=nope: no such team (teams: ml-research, llm-platform)"


def test_standalone_app_reads_cdk_json_and_writes_cdk_out(monkeypatch: pytest.MonkeyPatch) -> None:
    import app as app_module

    monkeypatch.delenv("CDK_OUTDIR", raising=False)
    app = app_module._standalone_app()
    assert Path(app.outdir) == REPO_ROOT / "cdk.out"
    cdk_json = json.loads((REPO_ROOT / "cdk.json").read_text())
    assert cdk_json["app"] == ".venv/bin/python app.py"
    assert app.node.try_get_context("teams_file") == cdk_json["context"]["teams_file"] == "teams.yaml"


def test_cdk_cli_synth_of_one_team(tmp_path: Path, cdk_cli: Path) -> None:
    """`cdk synth -c teams_file=... -c team=NAME` writes exactly that team's template (`make synth` path)."""
    teams = tmp_path / "teams.yaml"
    teams.write_text((REPO_ROOT / "teams.yaml").read_text())
    env = dict(os.environ, JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION="20")
    run = subprocess.run(
        [
            str(cdk_cli),
            "synth",
            "--quiet",
            "-o",
            str(tmp_path / "out"),
            "-c",
            f"teams_file={teams}",
            "-c",
            "team=llm-platform",
        ],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert sorted(p.name for p in (tmp_path / "out").glob("*.template.json")) == [
        "llm-platform.template.json"
    ]
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert "missing" not in manifest
