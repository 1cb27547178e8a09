"""The policy scan: checkov (a virtual environment of its own, Makefile CHECKOV_VENV) over what the team
stacks deploy and what the trainer chart renders, and the accepted findings docs/infra.md lists with why.

What is scanned: the synthesized CloudFormation templates (framework `cloudformation`); the Kubernetes
objects those templates apply through the kubectl provider (framework `kubernetes`; checkov does not look
inside a custom resource's `Manifest` string, so they are written out as YAML); and the chart rendered
with its defaults, with each team's release values (Contract 1) and as the cluster smoke release. A
finding is named independently of team and release (`Finding.resource`), so one line of the table covers
every team and every render. checkov runs with `--skip-download` and never needs the network.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from aws_cdk import CfnResource

from tests.infra.helpers import flatten

KUBERNETES_RESOURCE = "Custom::AWSCDK-EKS-KubernetesResource"
JUSTIFICATIONS_HEADING = "### Policy scan (checkov): accepted findings"
# The trainer Job's and the key initializer's names end in a digest of their spec (a new spec, a new Job).
_DIGEST_SUFFIX = re.compile(r"-[0-9a-f]{6}$")
_RULE = re.compile(r"\bCKV2?_[A-Z0-9]+_\d+\b")


@dataclass(frozen=True, order=True)
class Finding:
    """A failed check. `resource`: `<CloudFormation type> <construct path below the stack>` for a template
    resource, `<kind> <name>` for a Kubernetes object, where a chart object's release name reads
    `<release>` and a Job's digest suffix `<digest>`."""

    rule: str
    resource: str


@dataclass(frozen=True)
class ScanResult:
    """Every finding (a set: the same finding in several teams or renders counts once), how often each
    rule failed over all inputs (per team and render), and the checks that passed."""

    findings: frozenset[Finding]
    failures_by_rule: Mapping[str, int]
    passed: int


# -- inputs ------------------------------------------------------------------------------------------
def stack_manifests(template: Mapping[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """The Kubernetes objects a template applies, by the logical id of the resource that applies them."""
    return {
        logical_id: json.loads(flatten(resource["Properties"]["Manifest"]))
        for logical_id, resource in template["Resources"].items()
        if resource["Type"] == KUBERNETES_RESOURCE
    }


@dataclass(frozen=True)
class ScanInputs:
    """The folders checkov scans and what maps its resource names back to `Finding.resource`."""

    cloudformation: Path
    kubernetes: Path
    paths: Mapping[str, Mapping[str, str]]  # by template file name: logical id -> construct path
    releases: Mapping[str, str]  # the release name of each rendered chart file


def construct_paths(stack: Any) -> dict[str, str]:
    """Logical id -> construct path below the stack, for every CloudFormation resource of a CDK stack
    (the templates carry no path metadata: cdk.json turns it off)."""
    paths = {}
    for construct in stack.node.find_all():
        if isinstance(construct, CfnResource):
            logical_id = str(stack.resolve(stack.get_logical_id(construct)))
            paths[logical_id] = construct.node.path.split("/", 1)[1].removesuffix("/Resource")
    return paths


def write_inputs(
    dest: Path,
    templates: Mapping[str, Mapping[str, Any]],
    paths: Mapping[str, Mapping[str, str]],
    renders: Mapping[str, tuple[str, str]],
) -> ScanInputs:
    """`templates`: CloudFormation templates by stack name, `paths` their `construct_paths`; `renders`:
    `(release, helm template output)` by a label naming the values."""
    cfn, k8s = dest / "cloudformation", dest / "kubernetes"
    cfn.mkdir(parents=True)
    k8s.mkdir(parents=True)
    files = {}
    for stack, template in templates.items():
        name = f"{stack}.template.json"
        (cfn / name).write_text(json.dumps(template))
        files[name] = paths[stack]
        for logical_id, objects in stack_manifests(template).items():
            (k8s / f"stack-{stack}-{logical_id}.yaml").write_text(yaml.safe_dump_all(objects))
    releases = {}
    for label, (release, rendered) in renders.items():
        name = f"chart-{label}.yaml"
        (k8s / name).write_text(rendered)
        releases[name] = release
    return ScanInputs(cfn, k8s, files, releases)


# -- the scan ----------------------------------------------------------------------------------------
def _start(checkov: Path, folder: Path, framework: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            str(checkov),
            "-d",
            str(folder),
            "--framework",
            framework,
            "--skip-download",
            "-o",
            "json",
            "--quiet",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _report(process: subprocess.Popen[str], framework: str) -> dict[str, Any]:
    """checkov's JSON report; exit 1 only means that a check failed."""
    stdout, stderr = process.communicate(timeout=300)
    if process.returncode not in (0, 1):
        raise RuntimeError(f"checkov ({framework}) exited {process.returncode}: {stderr.strip()[-2000:]}")
    report = json.loads(stdout)
    (report,) = report if isinstance(report, list) else [report]
    if report["summary"]["parsing_errors"]:
        raise RuntimeError(f"checkov ({framework}) could not parse: {report['results']['parsing_errors']}")
    return report


def _cloudformation_resource(inputs: ScanInputs, check: Mapping[str, Any]) -> str:
    resource_type, logical_id = check["resource"].split(".", 1)
    return f"{resource_type} {inputs.paths[Path(check['file_path']).name][logical_id]}"


def _kubernetes_resource(inputs: ScanInputs, check: Mapping[str, Any]) -> str:
    kind, _namespace, name = check["resource"].split(".", 2)  # a namespace has no dot; a name may
    release = inputs.releases.get(Path(check["file_path"]).name)
    if release is not None and (name == release or name.startswith(f"{release}-")):
        name = "<release>" + name.removeprefix(release)
    if kind == "Job":
        name = _DIGEST_SUFFIX.sub("-<digest>", name)
    return f"{kind} {name}"


def scan(checkov: Path, inputs: ScanInputs) -> ScanResult:
    """Both frameworks at once (two processes): the scan's time is the slower one's."""
    running = {
        "cloudformation": _start(checkov, inputs.cloudformation, "cloudformation"),
        "kubernetes": _start(checkov, inputs.kubernetes, "kubernetes"),
    }
    reports = {framework: _report(process, framework) for framework, process in running.items()}
    name_of = {"cloudformation": _cloudformation_resource, "kubernetes": _kubernetes_resource}
    findings: set[Finding] = set()
    by_rule: dict[str, int] = {}
    for framework, report in reports.items():
        for check in report.get("results", {}).get("failed_checks", []):
            findings.add(Finding(check["check_id"], name_of[framework](inputs, check)))
            by_rule[check["check_id"]] = by_rule.get(check["check_id"], 0) + 1
    passed = sum(report["summary"]["passed"] for report in reports.values())
    return ScanResult(frozenset(findings), dict(sorted(by_rule.items())), passed)


# -- the accepted findings ---------------------------------------------------------------------------
def justified(doc: str) -> dict[Finding, str]:
    """The table under JUSTIFICATIONS_HEADING: `| rules | resources (each in backticks) | why |`, each
    rule of a row with each of its resources one accepted finding, mapped to its reason."""
    if JUSTIFICATIONS_HEADING not in doc:
        raise ValueError(f"docs/infra.md has no section {JUSTIFICATIONS_HEADING!r}")
    section = doc.split(JUSTIFICATIONS_HEADING, 1)[1].split("\n#", 1)[0]
    accepted: dict[Finding, str] = {}
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("CKV"):
            continue
        rules = _RULE.findall(cells[0])
        resources = re.findall(r"`([^`]+)`", cells[1])
        if not rules or not resources or not cells[2]:
            raise ValueError(f"a row of {JUSTIFICATIONS_HEADING!r} lacks a rule, resource or reason: {line}")
        for rule in rules:
            for resource in resources:
                accepted[Finding(rule, resource)] = cells[2]
    return accepted


def describe(findings: Iterable[Finding]) -> str:
    return "\n".join(f"  {f.rule} {f.resource}" for f in sorted(findings))
