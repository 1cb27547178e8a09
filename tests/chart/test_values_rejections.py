"""Chart values, one case per row: each bad value fails `helm template` with one message naming it, and
every string that passes reaches the manifest as exactly that string (never pasted into YAML)."""

from __future__ import annotations

import json
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
    ({"entrypoint": "team.train\n  hostNetwork: true"}, "at '/entrypoint'"),
    ({"entrypoint": "team.train #x"}, "at '/entrypoint'"),
    ({"entrypointArgs": "--config x"}, "at '/entrypointArgs': got string, want array"),
    ({"entrypointArgs": ["a\0b"]}, "at '/entrypointArgs/0'"),
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
            "entrypointArgs": [EXACT, "yes", "0e0"],
        }
    )
    container = trainer_container(manifests)
    env = env_of(container)
    assert env["WEIRD"] == EXACT
    assert env["NUMBERLIKE"] == "0x1F"
    assert env["BOOLLIKE"] == "yes"
    # extraTrainerArgs end the trainer's options; the entry point's arguments follow `--` (the reference
    # model's own options first, the default entry point being the reference), entrypointArgs last.
    args = container["args"]
    cut = args.index("--")
    assert args[cut - 1] == EXACT and args[-3:] == [EXACT, "yes", "0e0"]
    job = next(m for m in manifests if m["kind"] == "Job")
    assert job["spec"]["template"]["metadata"]["annotations"]["example.com/note"] == EXACT


def test_image_digest_and_registry_port_render_exactly() -> None:
    digest = "sha256:" + "ab" * 32
    image = {"repository": "registry.example.com:5000/ml/trainer", "tag": digest}
    container = trainer_container(render({"image": image}))
    assert container["image"] == f"registry.example.com:5000/ml/trainer@{digest}"


# Values that helm used to accept and that could never run: each fails naming the value.
CANNOT_RUN = [
    ({"gpusPerNode": 9}, "gpusPerNode: 9 is more than instanceType p5.48xlarge has (8 GPUs)"),
    (
        {"instanceType": "p4d.24xlarge", "efaPerNode": 5},
        "efaPerNode: 5 is more than instanceType p4d.24xlarge has (4 EFA",
    ),
    (
        {"instanceType": "p5en.48xlarge", "efaPerNode": 32},
        "efaPerNode: 32 is more than instanceType p5en.48xlarge has (16",
    ),
    ({"metricsPort": 29400}, "metricsPort: 29400 is taken by the rendezvous store"),
    ({"metricsPort": 29401}, "metricsPort: 29401 is taken"),
    ({"metricsPort": 29402}, "metricsPort: 29402 is taken"),
    (
        {"rdzvPort": 7000, "metricsPort": 7002},
        "metricsPort: 7002 is taken by the rendezvous store (rdzvPort 7000)",
    ),
    ({"rdzvPort": 65534}, "rdzvPort: 65534 leaves no room for the trainer's stores"),
    ({"memoryLimit": "256Gi"}, "memoryLimit: 256Gi is below memoryRequest (512Gi)"),
    ({"memoryRequest": "2G", "memoryLimit": "1900M"}, "memoryLimit: 1900M is below memoryRequest (2G)"),
    ({"memoryRequest": "1Gi", "memoryLimit": "1073741823"}, "memoryLimit: 1073741823 is below memoryRequest"),
    ({"memoryLimit": "600Gi", "shmSize": "700Gi"}, "shmSize: 700Gi is above memoryLimit (600Gi)"),
    (
        {"rendezvous": {"resources": {"requests": {"cpu": "8"}}}},
        "rendezvous.resources.requests.cpu: 8 is above rendezvous.resources.limits.cpu (4)",
    ),
    (
        {"rendezvous": {"resources": {"requests": {"memory": "3Gi"}}}},
        "rendezvous.resources.requests.memory: 3Gi is above rendezvous.resources.limits.memory (2Gi)",
    ),
    (
        {"helperResources": {"requests": {"cpu": "3"}}},
        "helperResources.requests.cpu: 3 is above helperResources.limits.cpu (2)",
    ),
    # Truncated to 40 characters, "smoke-" + 32 a's + "--b" ends in "-" even after one trimSuffix.
    (
        {"nameOverride": "a" * 32 + "--b"},
        'the resource name "smoke-' + "a" * 32 + '-" is not a DNS-1035 label',
    ),
    ({"extraEnv": {"RDZV_ENDPOINT": "x:1"}}, "extraEnv.RDZV_ENDPOINT: the pod command depends on it"),
    (
        {"extraEnv": {"NCCL_DEBUG": "INFO"}},
        "extraEnv.NCCL_DEBUG: the pod command depends on it (set it with ncclDebug)",
    ),
    (
        {"extraEnv": {"MASTER_PORT": "1"}},
        "extraEnv.MASTER_PORT: the pod command depends on it (set by ft_launcher",
    ),
    (
        {"extraEnv": {"TORCHELASTIC_RUN_ID": "x"}},
        "extraEnv.TORCHELASTIC_RUN_ID: the pod command depends on it",
    ),
    (
        {"extraEnv": {"TRAINER_FAULTS": "sigkill:step=1"}},
        "extraEnv.TRAINER_FAULTS: the pod command depends on it",
    ),
    (
        {"storage": {**STORAGE, "mountPath": "/dev/shm"}},
        "storage.mountPath (/dev/shm) collides with /dev/shm",
    ),
    (
        {"storage": {**STORAGE, "mountPath": "/local-nvme/fsx"}},
        "storage.mountPath (/local-nvme/fsx) collides with",
    ),
    (
        {"storage": {**STORAGE, "mountPath": "/"}},
        "storage.mountPath (/) collides with the NVMe tier (/local-nvme)",
    ),
    ({"faults": {"a": "exception:rank=1"}}, 'faults.a: "exception:rank=1" needs step=N'),
    ({"faults": {"a": "sigkill:step=1000"}}, 'faults.a: "sigkill:step=1000" never fires: steps are 0 to 999'),
    ({"faults": {"a": "hang:step=3:step=4"}}, 'faults.a: "hang:step=3:step=4" gives step twice'),
    ({"faults": {"a": "sigkill:step=1:rank=16"}}, "names rank 16, but the run has 16 ranks"),
    ({"faults": {"a": "node-loss:step=1:node=2"}}, "names node 2, but the run has 2 nodes"),
    (
        {"faults": {"a": "ckpt-crash:step=1000"}, "ckptInterval": 300},
        "never fires: no checkpoint is saved at or after step 1000 "
        "(steps 1000: the last save follows step 999)",
    ),
    ({"seqLen": 8193}, "seqLen: 8193 is more than preset 8b supports (8192)"),
    ({"preset": "tiny", "seqLen": 513}, "seqLen: 513 is more than preset tiny supports (512)"),
]


@pytest.mark.parametrize(("values", "message"), CANNOT_RUN)
def test_values_that_cannot_run_fail_naming_the_value(values: dict[str, Any], message: str) -> None:
    stderr = rejection(values)
    assert message in stderr, stderr
    assert stderr.count("\n") <= 3, stderr  # one message (helm adds a blank line and a --debug hint)


@pytest.mark.parametrize(
    "values",
    [
        {"memoryLimit": "512Gi"},
        {"metricsPort": 29403},
        {"faults": {"a": "ckpt-crash:step=999"}},
        # No interval save at or after step 950 (899 is the last), but the final step always saves
        # (trainer/state/cadence.py is_due): the trainer fires it there, so the chart accepts it.
        {"faults": {"a": "ckpt-crash:step=950"}, "ckptInterval": 300},
        {"faults": {"a": "sigkill:step=999:rank=15:node=1"}},
        {"preset": "tiny", "seqLen": 512},
        {"storage": {**STORAGE, "mountPath": "/fsx/"}},
    ],
)
def test_boundaries_that_can_run_render(values: dict[str, Any]) -> None:
    render(values)


def test_one_instance_table_for_chart_schema_and_infra() -> None:
    """instance-types.json is the table infra loads; the schema's enum and the chart's limits follow it."""
    from infra.instance_types import GPU_INSTANCE_TYPES
    from tests.chart.helm import CHART

    table = json.loads((CHART / "instance-types.json").read_text())["types"]
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert schema["properties"]["instanceType"]["enum"] == list(table) == list(GPU_INSTANCE_TYPES)
    for name, facts in table.items():
        spec = GPU_INSTANCE_TYPES[name]
        assert (spec.gpus, spec.efa_interfaces) == (facts["gpus"], facts["efaInterfaces"])
        container = trainer_container(render({"instanceType": name, "efaPerNode": None}))
        assert container["resources"]["limits"]["vpc.amazonaws.com/efa"] == spec.efa_interfaces
        too_many = rejection({"instanceType": name, "gpusPerNode": spec.gpus + 1})
        assert (
            f"gpusPerNode: {spec.gpus + 1} is more than instanceType {name} has ({spec.gpus} GPUs)"
            in too_many
        )


def test_preset_sequence_limits_mirror_the_trainer() -> None:
    from trainer.reference.model import PRESETS

    for preset, cfg in PRESETS.items():
        render({"preset": preset, "seqLen": cfg.max_seq_len})
        assert f"more than preset {preset} supports" in rejection(
            {"preset": preset, "seqLen": cfg.max_seq_len + 1}
        )


def test_release_name_that_makes_an_invalid_service_name_is_refused() -> None:
    from tests.chart.helm import template_result

    result = template_result(None, release="1run")
    assert result.returncode != 0
    assert 'release name: the resource name "1run-trainer" is not a DNS-1035 label' in result.stderr


def test_null_for_a_value_with_a_default_is_refused_by_name() -> None:
    """A null in a values file deletes the default; the templates would then fail with a Go stack."""
    import yaml

    from tests.chart.helm import CHART

    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert set(schema["required"]) == {k for k, v in defaults.items() if v is not None}
    assert "missing property 'preset'" in rejection({"preset": None})
    assert "missing property 'tag'" in rejection({"image": {"repository": "trainer", "tag": None}})


def test_values_added_with_hardening_follow_the_same_rules() -> None:
    assert "storage.mountPath (/tmp/fsx) collides with the scratch volume (/tmp)" in rejection(
        {"storage": {**STORAGE, "mountPath": "/tmp/fsx"}}
    )
    assert "extraEnv.HOME: the pod command depends on it" in rejection({"extraEnv": {"HOME": "/root"}})
    assert "missing property 'networkPolicy'" in rejection({"networkPolicy": None})
