"""Builds the CDK app from validated team configs: one stack per team, cdk-nag as a validation plugin."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aws_cdk import App, Validations
from cdk_nag import AwsSolutionsChecks

from infra.config import TeamConfig, TeamsConfigError
from infra.nag import acknowledge_findings
from infra.team_stack import TeamStack

REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class AppOptions:
    """What app.py reads from the CDK context (cdk.json or `-c key=value`)."""

    chart_dir: Path = REPO_ROOT / "k8s"
    image_dir: Path = REPO_ROOT
    nag: bool = True


def cdk_json_context() -> dict[str, Any]:
    """The `context` of the repo's cdk.json (feature flags and defaults), for apps not run by the CLI."""
    cdk_json = REPO_ROOT / "cdk.json"
    if not cdk_json.is_file():
        return {}
    return dict(json.loads(cdk_json.read_text(encoding="utf-8")).get("context", {}))


def check_assets(teams: list[TeamConfig], options: AppOptions) -> None:
    """Fail in one line when a team deploys the trainer but the chart or Dockerfile is missing."""
    if not any(t.deploy_trainer for t in teams):
        return
    if not (options.chart_dir / "Chart.yaml").is_file():
        raise TeamsConfigError(f"chart_dir: {options.chart_dir}/Chart.yaml not found (the trainer chart)")
    if not (options.image_dir / "Dockerfile").is_file():
        raise TeamsConfigError(f"image_dir: {options.image_dir}/Dockerfile not found (the trainer image)")


def build_app(app: App, teams: list[TeamConfig], options: AppOptions) -> list[TeamStack]:
    """Add one `TeamStack` per team to `app` (and cdk-nag AwsSolutions unless disabled)."""
    check_assets(teams, options)
    stacks = [
        TeamStack(app, team=team, chart_dir=options.chart_dir, image_dir=options.image_dir) for team in teams
    ]
    if options.nag:
        Validations.of(app).add_plugins(AwsSolutionsChecks(app))
        for stack in stacks:
            acknowledge_findings(stack)
    return stacks
