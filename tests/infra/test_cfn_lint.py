"""The cfn-lint runner the template check relies on: it reports findings, and fails when cfn-lint fails."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.infra.cfn_lint import CfnLintFailed, cfn_lint


def _template(tmp_path: Path, name: str, resource_type: str) -> Path:
    path = tmp_path / name
    path.write_text(json.dumps({"Resources": {"Bucket": {"Type": resource_type}}}))
    return path


def test_a_clean_template_has_no_findings(tmp_path: Path) -> None:
    assert cfn_lint([_template(tmp_path, "ok.json", "AWS::S3::Bucket")]) == []


def test_an_invalid_resource_type_is_an_error_finding(tmp_path: Path) -> None:
    findings = cfn_lint([_template(tmp_path, "bad.json", "AWS::S3::NoSuchThing")])
    assert [f["Level"] for f in findings] == ["Error"]
    assert findings[0]["Rule"]["Id"].startswith("E")


def test_a_cfn_lint_that_cannot_run_fails_instead_of_reading_as_clean(tmp_path: Path) -> None:
    ok = _template(tmp_path, "ok.json", "AWS::S3::Bucket")
    # `python -m cfnlint` exits 1 with "No module named cfnlint.__main__" and prints nothing on stdout:
    # the old check read that as no findings.
    with pytest.raises(CfnLintFailed, match="exited 1"):
        cfn_lint([ok], command=[sys.executable, "-m", "cfnlint", "--format", "json"])
    with pytest.raises(CfnLintFailed, match="not JSON"):
        cfn_lint([ok], command=[sys.executable, "-c", "print('Traceback')"])
    # Findings that do not match the exit status (a truncated report) fail too.
    with pytest.raises(CfnLintFailed, match="exit status 2"):
        cfn_lint([ok], command=[sys.executable, "-c", 'print(\'[{"Level": "Error"}]\')'])


def test_templates_are_linted_for_their_own_region(tmp_path: Path) -> None:
    # cfn-lint checks instance types against the region's offer: p5e.48xlarge exists in us-east-2 only.
    path = tmp_path / "lt.json"
    data = {"InstanceType": "p5e.48xlarge"}
    path.write_text(json.dumps({"Resources": {"Lt": {"Type": "AWS::EC2::LaunchTemplate", "Properties": {
        "LaunchTemplateData": data}}}}))  # fmt: skip
    assert cfn_lint([path], region="us-east-2") == []
    assert [f["Rule"]["Id"] for f in cfn_lint([path], region="us-east-1")] == ["E3628"]
