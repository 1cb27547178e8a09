"""Run cfn-lint and read its findings, failing when cfn-lint itself fails (a helper module, not a test
module). A crashed or mis-invoked cfn-lint prints nothing on stdout: read as "no findings" it would let
every template pass, so the exit status, stderr and the JSON are all checked against each other."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

CFN_LINT = [str(Path(sys.executable).with_name("cfn-lint")), "--format", "json"]
# cfn-lint's exit status ORs one bit per level found; any other bit (1: a crash, a usage error) means
# cfn-lint failed, whatever it printed.
LEVEL_BITS = {"Error": 2, "Warning": 4, "Informational": 8}


class CfnLintFailed(AssertionError):
    """cfn-lint did not run to the end: its exit status, stderr or output say so."""


def cfn_lint(
    templates: Sequence[str | Path], region: str | None = None, command: Sequence[str] = CFN_LINT
) -> list[dict[str, Any]]:
    """cfn-lint's findings for ``templates`` deployed to ``region`` (cfn-lint's default: us-east-1), a list,
    empty when clean; raises CfnLintFailed when cfn-lint itself fails."""
    if not templates:
        raise CfnLintFailed("no templates to lint")
    regions = ["--regions", region] if region else []
    run = subprocess.run(
        # Templates before --regions: it takes several values and would swallow them.
        [*command, *map(str, templates), *regions],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    context = f"cfn-lint exited {run.returncode}; stderr: {run.stderr.strip()[-2000:]!r}"
    if run.returncode & ~sum(LEVEL_BITS.values()) or run.stderr.strip():
        raise CfnLintFailed(context)
    try:
        findings = json.loads(run.stdout)
    except json.JSONDecodeError as err:
        raise CfnLintFailed(f"{context}; stdout is not JSON ({err}): {run.stdout[:500]!r}") from None
    if not isinstance(findings, list):
        raise CfnLintFailed(f"{context}; expected a JSON list of findings, got {type(findings).__name__}")
    expected = 0
    for finding in findings:
        expected |= LEVEL_BITS.get(finding.get("Level"), 0)
    if expected != run.returncode:
        raise CfnLintFailed(f"{context}; the findings' levels call for exit status {expected}")
    return findings
