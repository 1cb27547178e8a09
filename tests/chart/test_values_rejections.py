"""Chart values, one case per row: each bad value fails `helm template` with one message naming it, and
every string that passes reaches the manifest as exactly that string (never pasted into YAML)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.chart.helm import env_of, rejection, render, trainer_container, workload_pod_spec

STORAGE = {"claimName": "fsx", "mountPath": "/fsx", "localNvmePath": "/mnt/nvme"}

# Injection: strings that would add or change YAML if pasted; the schema refuses them by name.
INJECTIONS = [
    ({"serviceAccountName": "trainer\n  hostNetwork: true"}, "at '/serviceAccountName'"),
    ({"storage": {**STORAGE, "claimName": "fsx\n      readOnly: true"}}, "at '/storage/claimName'"),
    ({"storage": {**STORAGE, "mountPath": "/fsx\n  hostNetwork: true"}}, "at '/storage/mountPath'"),
    ({"storage": {**STORAGE, "localNvmePath": "/mnt/nvme #x"}}, "at '/storage/localNvmePath'"),
    ({"storage": {**STORAGE, "mountPath": "/fsx/../etc"}}, "at '/storage/mountPath'"),
    ({"image": {"repository": "trainer", "tag": "v1 #prod"}}, "at '/image/tag'"),
    ({"image": {"repository": "trainer", "tag": "v1\nx"}}, "at '/image/tag'"),
    ({"image": {"repository": "Trainer:latest"}}, "at '/image/repository'"),
    ({"image": {"repository": "trainer", "tag": 1.0}}, "at '/image/tag': got number, want string"),
    ({"priorityClassName": "high: x"}, "at '/priorityClassName'"),
    ({"schedulerName": "volcano\n  hostPID: true"}, "at '/schedulerName'"),
    ({"nameOverride": "Trainer"}, "at '/nameOverride'"),
    ({"fullnameOverride": "run\n  x: y"}, "at '/fullnameOverride'"),
    ({"clusterDomain": "cluster.local:80"}, "at '/clusterDomain'"),
    ({"ncclSocketIfname": "eth0\n- name: X"}, "at '/ncclSocketIfname'"),
    ({"nodeSelector": {"team": "a b"}}, "at '/nodeSelector/team'"),
    ({"podLabels": {"bad key": "x"}}, 'podLabels: key "bad key" is not a Kubernetes qualified name'),
    ({"podAnnotations": {"a\nb": "x"}}, 'podAnnotations: key "a\\nb" is not a Kubernetes qualified name'),
    ({"extraEnv": {"BIG": 100000000}}, "at '/extraEnv/BIG': got number, want string"),
    ({"extraEnv": {"BAD-NAME": "x"}}, 'extraEnv: key "BAD-NAME" is not an environment variable name'),
    ({"dataPath": "/fsx/data\ttokens.npy"}, "at '/dataPath'"),
]


@pytest.mark.parametrize(("values", "message"), INJECTIONS)
def test_injection_is_refused_naming_the_value(values: dict[str, Any], message: str) -> None:
    stderr = rejection(values)
    assert message in stderr, stderr


def test_strings_that_look_like_other_yaml_types_stay_strings() -> None:
    manifests = render({"storage": {**STORAGE, "claimName": "true"}, "serviceAccountName": "null"})
    spec = workload_pod_spec(manifests)
    claims = [
        v["persistentVolumeClaim"]["claimName"] for v in spec["volumes"] if "persistentVolumeClaim" in v
    ]
    assert claims == ["true"]
    assert spec["serviceAccountName"] == "null"


# Free-form strings the chart must carry exactly (env values, annotations, trainer arguments).
EXACT = "a: b #c\n- d\n'e\" {{ f }} \\g \u00e9\u4e2d"


def test_free_form_strings_reach_the_manifest_exactly() -> None:
    manifests = render(
        {
            "extraEnv": {"WEIRD": EXACT, "NUMBERLIKE": "0x1F", "BOOLLIKE": "yes"},
            "podAnnotations": {"example.com/note": EXACT},
            "extraTrainerArgs": [EXACT],
        }
    )
    container = trainer_container(manifests)
    env = env_of(container)
    assert env["WEIRD"] == EXACT
    assert env["NUMBERLIKE"] == "0x1F"
    assert env["BOOLLIKE"] == "yes"
    assert container["args"][-1] == EXACT
    job = next(m for m in manifests if m["kind"] == "Job")
    assert job["spec"]["template"]["metadata"]["annotations"]["example.com/note"] == EXACT


def test_image_digest_and_registry_port_render_exactly() -> None:
    digest = "sha256:" + "ab" * 32
    image = {"repository": "registry.example.com:5000/ml/trainer", "tag": digest}
    container = trainer_container(render({"image": image}))
    assert container["image"] == f"registry.example.com:5000/ml/trainer@{digest}"
