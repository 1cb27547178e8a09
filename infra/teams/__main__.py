"""`python -m infra.teams [TEAMS_FILE] [--team NAME]`: validate a teams file without synthesizing.

Exit status 0 with a summary, or 2 with the one-line error as the last line, so `make synth` stops there
before the CDK CLI (which reports any app failure as its own `Subprocess exited with error` line, exit 1).
"""

from __future__ import annotations

import argparse
import sys

from infra.teams.errors import TeamsConfigError
from infra.teams.loader import load_teams, select_team


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m infra.teams", description=__doc__.splitlines()[0])
    parser.add_argument("teams_file", nargs="?", default="teams.yaml")
    parser.add_argument("--team", default=None, help="check that this team exists")
    args = parser.parse_args(argv)
    try:
        teams = select_team(load_teams(args.teams_file), args.team)
    except TeamsConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    # A configuration that works but reloads slowly: one warning line per team, on stderr (make synth
    # sends stdout to /dev/null and goes on).
    for team in teams:
        for warning in team.storage_sizing.warnings:
            print(f"warning: team {team.name}: {warning}", file=sys.stderr)
    print(f"{args.teams_file}: {len(teams)} team(s) valid: {', '.join(t.name for t in teams)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
