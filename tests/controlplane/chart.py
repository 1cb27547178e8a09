"""The chart as infra installs it, for the control-plane tests: one synth of the default team (its
KubernetesManifest objects and the trainer release's values, Contract 1), helm and kubectl against the
session's API server, and the comparison of what was sent with what the server stored."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes.utils import parse_quantity

from tests.helpers import HELM, REPO_ROOT
from tools.controlplane.launch import ControlPlane

KUBECTL = REPO_ROOT / ".tools" / "bin" / "kubectl"
PODMONITOR_CRD = REPO_ROOT / ".tools" / "controlplane" / "crds" / "podmonitors.yaml"
"""prometheus-operator's PodMonitor CRD (`make controlplane` fetches it): on EKS, kube-prometheus-stack's."""
CHART = REPO_ROOT / "k8s"
ADDON_NAMESPACES = ("amazon-cloudwatch",)
"""Namespaces an EKS add-on creates (the CloudWatch observability add-on), not infra's manifests; made
here first, as the add-on would be there before infra applies its objects into them."""


@dataclass(frozen=True)
class TeamRelease:
    """What one `cdk deploy` of a team puts on its cluster, with the CloudFormation placeholders resolved."""

    namespace: str
    manifests: list[dict[str, Any]]
    values: dict[str, Any]


def _concrete(value: Any, team: dict[str, Any]) -> Any:
    text = (
        json.dumps(value)
        .replace("<AWS::AccountId>", team["account"])
        .replace("<AWS::Region>", team["region"])
        .replace("<AWS::URLSuffix>", "amazonaws.com")
    )
    return json.loads(text)


def default_team_release(tmp: Path) -> TeamRelease:
    """Synthesize the first team of teams.yaml alone and read its manifests and trainer release."""
    from aws_cdk import App

    from infra.app_builder import AppOptions, build_app, cdk_json_context
    from infra.config import parse_teams
    from tests.infra.helpers import helm_releases, manifests

    team = yaml.safe_load((REPO_ROOT / "teams.yaml").read_text())["teams"][0]
    image_dir = tmp / "image"
    image_dir.mkdir(parents=True)
    (image_dir / "Dockerfile").write_text("FROM scratch\n")
    (image_dir / ".dockerignore").write_text("*\n!Dockerfile\n")
    app = App(outdir=str(tmp / "cdk.out"), context=cdk_json_context())
    build_app(app, parse_teams({"teams": [team]}), AppOptions(CHART, image_dir, nag=False))
    app.synth()
    template = json.loads((tmp / "cdk.out" / f"{team['name']}.template.json").read_text())
    release = helm_releases(template)["trainer"]
    return TeamRelease(
        release["Namespace"], _concrete(manifests(template), team), _concrete(release["Values"], team)
    )


def run(
    plane: ControlPlane, binary: Path, *args: str, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    # Everything helm and kubectl cache or configure stays in the control plane's folder, not in $HOME.
    home = plane.workdir / "clients"
    env = {
        **os.environ,
        "KUBECONFIG": str(plane.kubeconfig),
        "KUBECACHEDIR": str(home / "kube-cache"),
        "HELM_CACHE_HOME": str(home / "helm-cache"),
        "HELM_CONFIG_HOME": str(home / "helm-config"),
        "HELM_DATA_HOME": str(home / "helm-data"),
    }
    return subprocess.run(
        [str(binary), *args], input=stdin, capture_output=True, text=True, env=env, timeout=120, check=False
    )


def helm(plane: ControlPlane, *args: str) -> subprocess.CompletedProcess[str]:
    return run(plane, HELM, *args)


def kubectl(plane: ControlPlane, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return run(plane, KUBECTL, *args, stdin=stdin)


def values_file(folder: Path, name: str, values: dict[str, Any]) -> Path:
    path = folder / f"{name}.json"
    path.write_text(json.dumps(values))
    return path


def lost_fields(sent: Any, stored: Any, path: str = "") -> list[str]:
    """Paths where the stored object does not hold what was sent: a field dropped (an unknown or
    misplaced key the server pruned) or changed. Fields the server adds (defaults, status) are fine."""
    if isinstance(sent, dict):
        if not isinstance(stored, dict):
            return [path or "."]
        return [
            lost
            for key, value in sent.items()
            if value not in (None, {}, [], "")  # the server drops an empty value (omitempty)
            for lost in (
                [f"{path}.{key}"] if key not in stored else lost_fields(value, stored[key], f"{path}.{key}")
            )
        ]
    if isinstance(sent, list):
        if not isinstance(stored, list) or len(sent) != len(stored):
            return [path]
        return [
            lost
            for i, (a, b) in enumerate(zip(sent, stored, strict=True))
            for lost in lost_fields(a, b, f"{path}[{i}]")
        ]
    if sent == stored or str(sent) == str(stored) or _same_quantity(sent, stored):
        return []
    return [f"{path}: sent {sent!r}, stored {stored!r}"]


def _same_quantity(sent: Any, stored: Any) -> bool:
    """The server writes quantities in canonical form (5120Mi is stored as 5Gi): the same amount."""
    if not (isinstance(sent, str) and isinstance(stored, str)):
        return False
    try:
        return bool(parse_quantity(sent) == parse_quantity(stored))
    except ValueError:
        return False
