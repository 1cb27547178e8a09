"""Deployable twice: two synths of one team with a different image and different chart values, and what
the API server would be asked on the second deploy (the rule and its references: docs/infra.md,
"Redeploys").

The second `cdk deploy` re-applies the KubernetesManifest objects (kubectl apply) and runs
`helm upgrade --install` of the trainer release: Helm applies every object of the new manifest that
keeps its name and deletes those that are gone. Either fails when an object keeps its name while a field
the API server refuses to update changes. So: render both deploys' objects exactly as they would be
applied (the manifests from the templates; the chart with the release values from the templates) and
check every object present in both against the immutable fields of its kind.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.checkpoint_key import INITIALIZER
from tests.helpers import REPO_ROOT
from tests.infra.helpers import flatten, helm_releases, manifests

HELM = REPO_ROOT / ".tools" / "bin" / "helm"
TEAM = "ml-research"

# Fields the API server refuses to change on update, by kind (docs/infra.md lists the sources).
# A dotted path names a field; "spec" alone means the whole spec except MUTABLE_IN_SPEC.
IMMUTABLE: dict[str, list[str]] = {
    "Job": [
        "spec.selector",
        "spec.template",
        "spec.completionMode",
        "spec.podFailurePolicy",
        "spec.backoffLimitPerIndex",
        "spec.completions",  # changeable only together with parallelism (elastic Indexed Jobs): not used
        "spec.managedBy",
        "spec.successPolicy",
    ],
    "JobSet": ["spec"],  # replicatedJobs, network, ... (the JobSet webhook); suspend excepted
    "Service": ["spec.clusterIP", "spec.clusterIPs", "spec.ipFamilies"],
    "PersistentVolumeClaim": ["spec"],  # only requests may grow, and only with an expanding StorageClass
    "PersistentVolume": ["spec.csi", "spec.volumeMode", "spec.nodeAffinity"],
    "StatefulSet": [
        "spec.selector",
        "spec.volumeClaimTemplates",
        "spec.serviceName",
        "spec.podManagementPolicy",
    ],
    "Deployment": ["spec.selector"],
    "DaemonSet": ["spec.selector"],
}
MUTABLE_IN_SPEC = {"suspend"}


def _get(obj: dict[str, Any], path: str) -> Any:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    if path == "spec" and isinstance(value, dict):
        value = {k: v for k, v in value.items() if k not in MUTABLE_IN_SPEC}
    return value


def _key(obj: dict[str, Any]) -> tuple[str, str, str]:
    return (obj["kind"], obj["metadata"].get("namespace", ""), obj["metadata"]["name"])


def refused_updates(before: Iterable[dict[str, Any]], after: Iterable[dict[str, Any]]) -> list[str]:
    """Objects that keep their name while an immutable field changes: `Kind ns/name: field`."""
    old = {_key(o): o for o in before}
    problems = []
    for obj in after:
        previous = old.get(_key(obj))
        if previous is None:
            continue
        for path in IMMUTABLE.get(obj["kind"], []):
            if _get(previous, path) != _get(obj, path):
                kind, namespace, name = _key(obj)
                problems.append(f"{kind} {namespace}/{name}: {path}")
    return problems


# -- two deploys ------------------------------------------------------------------------------------
def _synth(tmp: Path, team: dict[str, Any], dockerfile: str) -> dict[str, Any]:
    from aws_cdk import App

    from infra.app_builder import AppOptions, build_app, cdk_json_context
    from infra.config import parse_teams

    image_dir = tmp / "image"
    image_dir.mkdir(parents=True)
    (image_dir / "Dockerfile").write_text(dockerfile)
    (image_dir / ".dockerignore").write_text("*\n!Dockerfile\n")
    app = App(outdir=str(tmp / "cdk.out"), context=cdk_json_context())
    build_app(app, parse_teams({"teams": [team]}), AppOptions(REPO_ROOT / "k8s", image_dir, nag=False))
    app.synth()
    return dict(json.loads((tmp / "cdk.out" / f"{TEAM}.template.json").read_text()))


def _concrete(text: str, team: dict[str, Any]) -> str:
    """Pseudo-parameter placeholders of a flattened value, as CloudFormation would resolve them."""
    return (
        text.replace("<AWS::AccountId>", team["account"])
        .replace("<AWS::Region>", team["region"])
        .replace("<AWS::URLSuffix>", "amazonaws.com")
    )


def _release_objects(template: dict[str, Any], team: dict[str, Any], tmp: Path) -> list[dict[str, Any]]:
    """The trainer release's objects as `helm upgrade --install` would apply them (hooks excluded:
    `helm test` pods are deleted and created anew on every test run)."""
    release = helm_releases(template)["trainer"]
    values = json.loads(_concrete(json.dumps(release["Values"]), team))
    values_file = tmp / "values.json"
    values_file.write_text(json.dumps(values))
    run = subprocess.run(
        [
            str(HELM),
            "template",
            "trainer",
            str(REPO_ROOT / "k8s"),
            "-n",
            release["Namespace"],
            "-f",
            str(values_file),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    objects = [d for d in yaml.safe_load_all(run.stdout) if d]
    for obj in objects:
        obj["metadata"].setdefault("namespace", release["Namespace"])
    return [o for o in objects if "helm.sh/hook" not in (o["metadata"].get("annotations") or {})]


@pytest.fixture(scope="module")
def two_deploys(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict], list[dict], dict, dict]:
    base = next(
        t for t in yaml.safe_load((REPO_ROOT / "teams.yaml").read_text())["teams"] if t["name"] == TEAM
    )
    first = {**base, "start_trainer": False}
    # The second deploy: another image (the Dockerfile changed), more nodes, a larger file system, and
    # the team starts the trainer (the README's own flow).
    second = json.loads(json.dumps(base))
    second["start_trainer"] = True
    second["gpu_node_group"]["desired_nodes"] = 3
    second["fsx"]["storage_gib"] = 4800
    tmp = tmp_path_factory.mktemp("redeploy")
    out = []
    for i, (team, dockerfile) in enumerate(
        ((first, "FROM scratch\n"), (second, "FROM scratch\nLABEL v=2\n"))
    ):
        template = _synth(tmp / f"deploy{i}", team, dockerfile)
        release = helm_releases(template)["trainer"]
        objects = manifests(template) + _release_objects(template, team, tmp / f"deploy{i}")
        out.append((objects, release))
    (before, release1), (after, release2) = out
    return before, after, release1, release2


def test_the_two_deploys_differ_in_image_and_values(two_deploys: tuple) -> None:
    _, _, release1, release2 = two_deploys
    values1, values2 = release1["Values"], release2["Values"]
    assert flatten(values1["image"]["tag"]) != flatten(values2["image"]["tag"])
    assert (values1["nodes"], values1["suspend"]) == (2, True)
    assert (values2["nodes"], values2["suspend"]) == (3, False)


def test_no_object_keeps_its_name_while_an_immutable_field_changes(two_deploys: tuple) -> None:
    before, after, _, _ = two_deploys
    assert refused_updates(before, after) == []
    # Not vacuous: the objects that stay (Service, PV, PVC, namespace objects) were compared...
    kept = {_key(o) for o in before} & {_key(o) for o in after}
    assert {k[0] for k in kept} >= {"Service", "PersistentVolume", "PersistentVolumeClaim", "Namespace"}
    # ...and the Job, whose template changed, is a new object under a new name (Helm deletes the old).
    (job1,) = [o for o in before if o["kind"] == "Job" and not o["metadata"]["name"].startswith(INITIALIZER)]
    (job2,) = [o for o in after if o["kind"] == "Job" and not o["metadata"]["name"].startswith(INITIALIZER)]
    assert job1["metadata"]["name"] != job2["metadata"]["name"]
    # The checkpoint-key initializer did not change: the same Job, compared above and accepted.
    assert [k for k in kept if k[0] == "Job" and k[-1].startswith(INITIALIZER)]
    assert job1["spec"]["template"] != job2["spec"]["template"]


def test_only_suspend_changed_keeps_the_job(two_deploys: tuple, tmp_path: Path) -> None:
    """start_trainer alone flips `suspend`, which the API server accepts: the same Job starts in place."""
    _, _, release1, _ = two_deploys
    team = next(
        t for t in yaml.safe_load((REPO_ROOT / "teams.yaml").read_text())["teams"] if t["name"] == TEAM
    )
    jobs = []
    for suspend in (True, False):
        template = {"Resources": {"R": {"Type": "Custom::AWSCDK-EKS-HelmChart", "Properties": {**release1}}}}
        template["Resources"]["R"]["Properties"]["Values"] = json.dumps(
            {**release1["Values"], "suspend": suspend}
        )
        folder = tmp_path / str(suspend)
        folder.mkdir()
        (job,) = [o for o in _release_objects(template, team, folder) if o["kind"] == "Job"]
        jobs.append(job)
    assert jobs[0]["metadata"]["name"] == jobs[1]["metadata"]["name"]
    assert (jobs[0]["spec"]["suspend"], jobs[1]["spec"]["suspend"]) == (True, False)
    assert refused_updates([jobs[0]], [jobs[1]]) == []


def test_the_check_catches_a_refused_update() -> None:
    """The checker itself: the failure this test file guards against, and its fix (a new name)."""
    job = {"kind": "Job", "metadata": {"name": "t-abc", "namespace": "a"}, "spec": {"template": {"x": 1}}}
    changed = json.loads(json.dumps(job))
    changed["spec"]["template"] = {"x": 2}
    assert refused_updates([job], [changed]) == ["Job a/t-abc: spec.template"]
    changed["metadata"]["name"] = "t-def"
    assert refused_updates([job], [changed]) == []
    pvc = {
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": "c"},
        "spec": {"resources": {"requests": {"s": "1"}}},
    }
    grown = {**pvc, "spec": {"resources": {"requests": {"s": "2"}}}}
    assert refused_updates([pvc], [grown]) == ["PersistentVolumeClaim /c: spec"]
