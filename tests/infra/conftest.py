"""One synth of the whole app per test session, shared by every infra test (synth takes seconds, ~400 MiB).

The app is the checked-in teams.yaml plus tests/infra/extra_teams.yaml, so one synth covers all four GPU
instance types and all three capacity kinds. The image asset's build context is a scratch copy of the
repo's .dockerignore with decoy folders, so the test checks what asset staging really copies.
"""

from __future__ import annotations

import json

import pytest
import yaml

from tests.helpers import REPO_ROOT
from tests.infra._synth import HERE, SynthResult, image_context


@pytest.fixture(scope="session")
def teams_data() -> dict:
    """teams.yaml + extra_teams.yaml as one parsed document."""
    base = yaml.safe_load((REPO_ROOT / "teams.yaml").read_text())
    extra = yaml.safe_load((HERE / "extra_teams.yaml").read_text())
    return {"teams": base["teams"] + extra["teams"]}


@pytest.fixture(scope="session")
def synth(tmp_path_factory: pytest.TempPathFactory, teams_data: dict) -> SynthResult:
    from aws_cdk import App

    from infra.app_builder import AppOptions, build_app, cdk_json_context
    from infra.config import parse_teams

    tmp = tmp_path_factory.mktemp("synth")
    teams = parse_teams(teams_data)
    image_dir = image_context(tmp / "image")
    outdir = tmp / "cdk.out"
    app = App(outdir=str(outdir), context=cdk_json_context())
    stacks = build_app(app, teams, AppOptions(chart_dir=REPO_ROOT / "k8s", image_dir=image_dir, nag=True))
    error: Exception | None = None
    try:
        app.synth()
    except Exception as exc:  # a nag failure surfaces here; test_nag reports it with the findings
        error = exc
    return SynthResult(
        app, {s.team.name: s for s in stacks}, {t.name: t for t in teams}, outdir, image_dir, error
    )


@pytest.fixture(scope="session")
def templates(synth: SynthResult) -> dict[str, dict]:
    """The synthesized CloudFormation templates as JSON, by team name."""
    assert synth.error is None, f"synth failed: {synth.error}"
    return {name: json.loads((synth.outdir / f"{name}.template.json").read_text()) for name in synth.stacks}
