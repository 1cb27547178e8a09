#!/usr/bin/env python3
"""CDK app: one environment (stack) per team of the teams file, synthesized offline.

Context (cdk.json or `-c key=value`): teams_file (default teams.yaml), team (one team only), chart_dir,
image_dir, nag (true/false). Works under `cdk synth` and as `python app.py` (then it reads cdk.json itself
and writes to cdk.out/).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from aws_cdk import App

from infra.app_builder import REPO_ROOT, AppOptions, build_app, cdk_json_context
from infra.config import TeamsConfigError, load_teams, select_team


def _standalone_app() -> App:
    """An App that behaves like the CDK CLI's: cdk.json context and cdk.out as the output folder."""
    if "CDK_OUTDIR" in os.environ:  # run by the cdk CLI, which passes context and outdir itself
        return App()
    return App(outdir=str(REPO_ROOT / "cdk.out"), context=cdk_json_context())


def _flag(value: Any, default: bool) -> bool:
    if value is None:
        return default
    return str(value).lower() not in ("false", "0", "no")


def main() -> int:
    app = _standalone_app()
    ctx = app.node.try_get_context
    teams_file = Path(ctx("teams_file") or "teams.yaml")
    options = AppOptions(
        chart_dir=Path(ctx("chart_dir") or REPO_ROOT / "k8s"),
        image_dir=Path(ctx("image_dir") or REPO_ROOT),
        nag=_flag(ctx("nag"), default=True),
    )
    try:
        teams = select_team(load_teams(teams_file), ctx("team"))
        build_app(app, teams, options)
    except TeamsConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    app.synth()
    return 0


if __name__ == "__main__":
    sys.exit(main())
