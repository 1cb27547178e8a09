"""checkov over every team template, the Kubernetes objects the stacks apply and the trainer chart (its
defaults, each team's release values, the cluster smoke release): every finding is fixed or listed with
its reason in docs/infra.md ("Policy scan (checkov): accepted findings"), and every listed one still
occurs. One scan per module, on the session synth (tests/policy_scan.py says what is scanned)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.trainer_release import TRAINER_RELEASE, trainer_values
from tests.chart.helm import template_result
from tests.helpers import CHECKOV, HELM, REPO_ROOT, require_tool
from tests.infra._synth import SynthResult
from tests.infra.policy_scan import (
    Finding,
    ScanResult,
    construct_paths,
    describe,
    justified,
    scan,
    write_inputs,
)
from tools.cluster_smoke import make_parser, render_only
from tools.smoke_plan import SmokePlan

INFRA_DOC = REPO_ROOT / "docs" / "infra.md"
# Copies of fixed objects with the fix taken out, scanned with the rest: the scan must report each.
DECOY = "policy-decoy"
DECOY_FINDINGS = {
    Finding("CKV_K8S_8", f"Deployment {DECOY}-rendezvous"),  # liveness probe
    Finding("CKV_K8S_11", f"Deployment {DECOY}-rendezvous"),  # CPU limit
    Finding("CKV_K8S_38", f"Deployment {DECOY}-rendezvous"),  # service-account token
    Finding("CKV_AWS_158", f"AWS::Logs::LogGroup {DECOY}/Storage/S3BucketCheck/Logs"),  # log group key
}


def _render(values: dict[str, Any], release: str, namespace: str) -> str:
    result = template_result(values, release=release, namespace=namespace)
    assert result.returncode == 0, result.stderr
    return result.stdout


def _smoke_render() -> str:
    lines: list[str] = []
    assert render_only(make_parser().parse_args(["--render-only"]), SmokePlan(), out=lines.append) == 0
    return "\n".join(lines)


def _rendezvous_decoy(rendered: str) -> dict[str, Any]:
    """The chart's rendezvous Deployment without its liveness probe, CPU limit and token opt-out."""
    (deployment,) = [
        d
        for d in yaml.safe_load_all(rendered)
        if d and d["kind"] == "Deployment" and d["metadata"]["name"].endswith("-rendezvous")
    ]
    decoy = copy.deepcopy(deployment)
    decoy["metadata"]["name"] = f"{DECOY}-rendezvous"
    pod = decoy["spec"]["template"]["spec"]
    pod["automountServiceAccountToken"] = True
    (container,) = pod["containers"]
    del container["livenessProbe"]
    del container["resources"]["limits"]["cpu"]
    return decoy


def _log_group_decoy(
    template: dict[str, Any], paths: dict[str, str]
) -> tuple[dict[str, Any], dict[str, str]]:
    """The bucket check's log group without its KMS key, in a template of its own (and its paths)."""
    (logical_id,) = [lid for lid, path in paths.items() if path == "Storage/S3BucketCheck/Logs"]
    group = copy.deepcopy(template["Resources"][logical_id])
    del group["Properties"]["KmsKeyId"]
    group.pop("DependsOn", None)
    return {"Resources": {logical_id: group}}, {logical_id: f"{DECOY}/{paths[logical_id]}"}


@pytest.fixture(scope="module")
def policy_scan(synth: SynthResult, templates: dict, tmp_path_factory: pytest.TempPathFactory) -> ScanResult:
    checkov = require_tool(CHECKOV, "checkov")
    require_tool(HELM, "helm")
    image = ("registry.example/trainer", "0123456789abcdef")
    renders = {"defaults": (TRAINER_RELEASE, _render({}, TRAINER_RELEASE, "default"))}
    for name, team in synth.teams.items():
        values = json.loads(json.dumps(trainer_values(team, *image)))
        renders[f"team-{name}"] = (TRAINER_RELEASE, _render(values, TRAINER_RELEASE, name))
    renders["smoke"] = (make_parser().parse_args([]).release, _smoke_render())
    paths = {name: construct_paths(stack) for name, stack in synth.stacks.items()}
    decoy_template, decoy_paths = _log_group_decoy(templates["ml-research"], paths["ml-research"])
    inputs = write_inputs(
        tmp_path_factory.mktemp("policy"),
        {**templates, DECOY: decoy_template},
        {**paths, DECOY: decoy_paths},
        renders,
    )
    decoy = _rendezvous_decoy(renders["defaults"][1])
    (Path(inputs.kubernetes) / f"{DECOY}.yaml").write_text(yaml.safe_dump(decoy))
    return scan(checkov, inputs)


def test_the_scan_reports_what_each_fix_removes(policy_scan: ScanResult) -> None:
    assert policy_scan.passed > 1000, "checkov passed too few checks: did it scan the inputs?"
    missed = DECOY_FINDINGS - policy_scan.findings
    assert not missed, f"checkov no longer reports:\n{describe(missed)}"


def test_every_finding_is_fixed_or_justified_in_docs(policy_scan: ScanResult) -> None:
    accepted = justified(INFRA_DOC.read_text(encoding="utf-8"))
    real = {f for f in policy_scan.findings if DECOY not in f.resource}
    unjustified = real - set(accepted)
    assert not unjustified, (
        "checkov findings neither fixed nor listed in docs/infra.md (Policy scan (checkov): accepted "
        f"findings):\n{describe(unjustified)}"
    )


def test_every_justification_still_matches_a_finding(policy_scan: ScanResult) -> None:
    stale = set(justified(INFRA_DOC.read_text(encoding="utf-8"))) - policy_scan.findings
    assert not stale, (
        f"docs/infra.md accepts findings checkov no longer reports (remove them):\n{describe(stale)}"
    )


def test_the_justification_table_is_parsed_strictly() -> None:
    doc = "### Policy scan (checkov): accepted findings\n| rule | resources | why |\n| --- | --- | --- |\n"
    row = "| CKV_K8S_8 (liveness), CKV_K8S_9 | `Deployment a`, `Pod b` | one-shot |\n"
    assert justified(doc + row) == {
        Finding(rule, resource): "one-shot"
        for rule in ("CKV_K8S_8", "CKV_K8S_9")
        for resource in ("Deployment a", "Pod b")
    }
    with pytest.raises(ValueError, match="lacks a rule, resource or reason"):
        justified(doc + "| CKV_K8S_8 | Deployment a | one-shot |\n")
    with pytest.raises(ValueError, match="has no section"):
        justified(row)
