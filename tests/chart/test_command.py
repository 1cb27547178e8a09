"""The pod command (Contract 2): ft_launcher and the trainer accept exactly what the chart renders (after
the preforkWorkers wrapper, `python -m trainer.launcher`, which execs the launcher)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.chart.helm import by_kind, env_of, render, trainer_container
from tools.podcommand import launcher_argv
from tools.podspec import expand

CONTRACT_ENV = (
    "NNODES",
    "NPROC_PER_NODE",
    "RDZV_ENDPOINT",
    "JOB_ID",
    "DATA_PATH",
    "CHECKPOINT_DIR",
    "LOCAL_CHECKPOINT_DIR",
    "OUT_DIR",
)


def pod_argv(values: dict[str, Any] | None = None) -> tuple[list[str], dict[str, str]]:
    container = trainer_container(render(values))
    env = env_of(container)
    argv = [expand(a, env) for a in container["command"] + container["args"]]
    return launcher_argv(argv), env


def split(argv: list[str]) -> tuple[list[str], list[str]]:
    """(ft_launcher's flags, the trainer's flags) around `-m trainer` (the prefork wrapper dropped)."""
    argv = launcher_argv(argv)
    assert argv[0] == "ft_launcher"
    i = argv.index("-m")
    assert argv[i + 1] == "trainer"
    return argv[1:i], argv[i + 2 :]


def test_contract_2_command_shape() -> None:
    container = trainer_container(render())
    # preforkWorkers (the default): the prefork wrapper execs ft_launcher with the launcher's arguments.
    assert container["command"] == ["python", "-m", "trainer.launcher"]
    assert container["args"][0] == "ft_launcher"
    plain = trainer_container(render({"preforkWorkers": False}))
    assert plain["command"] == ["ft_launcher"] and plain["args"] == container["args"][1:]
    args = container["args"][1:]
    assert args[:5] == [
        "--nnodes=$(NNODES):$(MAX_NNODES)",
        "--nproc-per-node=$(NPROC_PER_NODE)",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=$(RDZV_ENDPOINT)",
        "--rdzv-id=$(JOB_ID)",
    ]
    assert "--ft-restart-policy=any-failed" in args
    i = args.index("-m")
    assert args[i + 1 : i + 5] == [
        "trainer",
        "--out-dir=$(OUT_DIR)",
        "--ckpt-dir=$(CHECKPOINT_DIR)",
        "--ckpt-local-dir=$(LOCAL_CHECKPOINT_DIR)",
    ]
    # The reference entry point (the default) gets its own options after `--`, its data among them.
    cut = args.index("--")
    assert "--entrypoint=trainer.reference:train" in args[i:cut]
    assert args[cut + 1 :] == [
        "--data-path=$(DATA_PATH)",
        "--preset=8b",
        "--seq-len=4096",
        "--micro-batch-size=1",
        "--lr=0.0003",
    ]
    assert not [a for a in args[:cut] if a.split("=")[0] in ("--data-path", "--preset", "--seq-len", "--lr")]
    env = env_of(container)
    assert all(name in env for name in CONTRACT_ENV)
    # Every env entry is a plain value, so the demo can take it as it is.
    assert all("value" in e and "valueFrom" not in e for e in container["env"])


def test_env_names_cluster_places() -> None:
    manifests = render({"nodes": 4, "gpusPerNode": 8, "rdzvPort": 29555}, release="r1")
    env = env_of(trainer_container(manifests))
    job = next(m for m in manifests if m["kind"] == "Job")["metadata"]["name"]
    assert env["NNODES"] == "4"
    assert env["NPROC_PER_NODE"] == "8"
    # The rendezvous service's Service (templates/rendezvous.yaml), not a pod of the Job.
    assert job.startswith("r1-trainer-")
    assert env["RDZV_ENDPOINT"] == "r1-trainer-rendezvous.team-a.svc.cluster.local:29555"
    assert env["JOB_ID"] == "r1-trainer"
    assert env["CHECKPOINT_DIR"] == "/fsx/checkpoints/r1-trainer"
    assert env["OUT_DIR"] == "/fsx/runs/r1-trainer"
    assert env["LOCAL_CHECKPOINT_DIR"] == "/local-nvme/checkpoints/r1-trainer"
    resumed = env_of(trainer_container(render({"runName": "llama-8b-run1"}, release="r2")))
    assert resumed["CHECKPOINT_DIR"] == "/fsx/checkpoints/llama-8b-run1"


def test_ft_launcher_accepts_the_rendered_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    """Parse the launcher half with NVRx's own parser and build its LaunchConfig (as ft_launcher does)."""
    from nvidia_resiliency_ext.fault_tolerance import launcher

    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # else config_from_args sets it in this process for good
    values = {
        "nodes": 3,
        "gpusPerNode": 8,
        "maxRestarts": 7,
        "ftRankHeartbeatTimeout": 700,
        "workersStopTimeout": 12,
        "terminationGracePeriodSeconds": 90,
    }
    argv, env = pod_argv(values)
    launcher_flags, trainer_flags = split(argv)
    args = launcher.get_args_parser().parse_args([*argv[1:]])
    # A wedged rank delays a restart by at most workersStopTimeout; forwarded SIGTERMs escalate to SIGKILL
    # before the kubelet's grace period ends.
    assert float(args.workers_stop_timeout) == 12
    assert float(args.term_timeout) == 80
    config, _cmd, cmd_args = launcher.config_from_args(args)
    assert (config.min_nodes, config.max_nodes, config.nproc_per_node) == (3, 3, 8)
    assert config.rdzv_endpoint == env["RDZV_ENDPOINT"]
    assert config.run_id == env["JOB_ID"]
    assert config.max_restarts == 7
    assert config.rdzv_configs["join_timeout"] == "1200"
    assert config.fault_tol_cfg.rank_heartbeat_timeout == 700
    assert config.fault_tol_cfg.initial_rank_heartbeat_timeout == 1200
    assert cmd_args[:3] == ["-u", "-m", "trainer"]
    assert cmd_args[3:] == trainer_flags
    assert launcher_flags  # launcher flags come before -m


def parse_trainer(tmp_path: Path, values: dict[str, Any] | None = None) -> Any:
    """The trainer's validated TrainConfig for the rendered flags (with a real data file, on CPU)."""
    from trainer.config.train_config import config_from_args

    data = tmp_path / "tokens.npy"
    np.save(data, np.zeros(4096, dtype=np.uint16))
    _, trainer_flags = split(pod_argv({**(values or {}), "dataPath": str(data), "device": "cpu"})[0])
    return config_from_args(trainer_flags, env={})


def test_trainer_accepts_the_rendered_flags(tmp_path: Path) -> None:
    from trainer.reference.config import reference_config

    faults = {"b-hard": "sigkill:step=40:rank=3", "a-soft": "exception:step=20:rank=1"}
    values = {"preset": "small", "steps": 60, "seqLen": 256, "faults": faults, "lr": 1e-4}
    cfg = parse_trainer(tmp_path, values)
    ref = reference_config(cfg.run.entry_args)  # the reference entry point's own options
    assert ref.model.preset == "small"
    assert cfg.run.steps == 60
    assert ref.data.seq_len == 256 and ref.data.path == tmp_path / "tokens.npy"
    assert ref.optim.lr == pytest.approx(1e-4)
    assert cfg.run.inprocess is True
    assert [(f.kind, f.step, f.rank) for f in cfg.faults.specs] == [("exception", 20, 1), ("sigkill", 40, 3)]
    assert str(cfg.ckpt.local_dir) == "/local-nvme/checkpoints/smoke-trainer"
    assert cfg.ckpt.mode == "nvrx"
    assert parse_trainer(tmp_path, {"inprocess": False}).run.inprocess is False


def test_default_flags_parse_as_the_trainer_expects() -> None:
    from trainer.config.train_config import make_parser, split_entry_args
    from trainer.reference.config import make_parser as reference_parser

    _, trainer_flags = split(pod_argv()[0])
    options, entry_args = split_entry_args(trainer_flags)
    args = make_parser().parse_args(options)
    ours = reference_parser().parse_args(list(entry_args))
    # The settings' own defaults (generated into values.yaml): auto is cuda on every node that shows a GPU.
    assert (ours.model__preset, ours.data__seq_len, args.run__device) == ("8b", 4096, "auto")
    assert str(ours.data__path) == "/fsx/data/tokens.npy"


def test_one_heartbeat_value_reaches_launcher_and_trainer() -> None:
    argv, _ = pod_argv({"ftRankHeartbeatTimeout": 777, "ftInitialRankHeartbeatTimeout": 900})
    launcher_flags, trainer_flags = split(argv)
    assert "--ft-rank-heartbeat-timeout=777" in launcher_flags
    assert "--heartbeat-timeout=777" in trainer_flags


def test_default_timeouts_pass_the_trainers_own_check(tmp_path: Path) -> None:
    cfg = parse_trainer(tmp_path)  # the trainer validates its timeouts on construction
    cfg.timeouts.check()
    assert cfg.timeouts.inprocess_barrier_timeout < cfg.timeouts.heartbeat_timeout


def test_large_integers_render_as_integers() -> None:
    """A values file makes every number a float; flags must still read `--steps=2000000`, not 2e+06."""
    _, trainer_flags = split(pod_argv({"steps": 2000000, "seed": 1000000})[0])
    assert "--steps=2000000" in trainer_flags
    assert "--seed=1000000" in trainer_flags


def test_resources_and_efa_per_instance_type() -> None:
    expected = {"p5.48xlarge": 32, "p5e.48xlarge": 32, "p5en.48xlarge": 16, "p4d.24xlarge": 4}
    for instance_type, efa in expected.items():
        manifests = render({"instanceType": instance_type})
        container = trainer_container(manifests)
        limits, requests = container["resources"]["limits"], container["resources"]["requests"]
        assert limits["vpc.amazonaws.com/efa"] == requests["vpc.amazonaws.com/efa"] == efa
        assert limits["nvidia.com/gpu"] == requests["nvidia.com/gpu"] == 8
        assert limits["hugepages-2Mi"] == requests["hugepages-2Mi"] == "5120Mi"
        selector = by_kind(manifests, "Job")[0]["spec"]["template"]["spec"]["nodeSelector"]
        assert selector == {
            "node.kubernetes.io/instance-type": instance_type,
            "blueprint.nvrx/node-role": "gpu",
        }
    # Explicit values win over the instance type's EFA count; 0 drops EFA and its env.
    assert trainer_container(render({"efaPerNode": 8}))["resources"]["limits"]["vpc.amazonaws.com/efa"] == 8
    no_efa = trainer_container(render({"efaPerNode": 0}))
    assert "vpc.amazonaws.com/efa" not in no_efa["resources"]["limits"]
    assert "FI_PROVIDER" not in env_of(no_efa)


def test_efa_and_nccl_env() -> None:
    env = env_of(trainer_container(render({"extraEnv": {"NCCL_DEBUG_SUBSYS": "INIT"}})))
    assert env["FI_PROVIDER"] == "efa"
    assert env["FI_EFA_USE_DEVICE_RDMA"] == "1"
    assert env["RDMAV_FORK_SAFE"] == "1"
    assert env["NCCL_SOCKET_IFNAME"] == "^lo,docker"
    assert env["NCCL_DEBUG_SUBSYS"] == "INIT"


def test_security_context_and_volumes() -> None:
    manifests = render()
    pod = by_kind(manifests, "Job")[0]["spec"]["template"]["spec"]
    container = trainer_container(manifests)
    sc = container["securityContext"]
    assert sc["privileged"] is False
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["IPC_LOCK"]}
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    assert pod["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Equal", "value": "true", "effect": "NoSchedule"}
    ]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["fsx"]["persistentVolumeClaim"] == {"claimName": "fsx-shared"}
    assert volumes["local-nvme"]["hostPath"] == {"path": "/mnt/nvme", "type": "Directory"}
    assert volumes["dshm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "64Gi"}
    mounts = {m["name"]: m["mountPath"] for m in container["volumeMounts"]}
    keys = {"replica-key": "/var/run/trainer/replica-key", "ckpt-key": "/var/run/trainer/ckpt-key"}
    assert mounts == {
        "fsx": "/fsx",
        "local-nvme": "/local-nvme",
        "dshm": "/dev/shm",
        "node-health": "/run/trainer-health",
        "scratch": "/tmp",
        **keys,
    }
    assert pod["serviceAccountName"] == "trainer"

    nonroot = render({"runAsNonRoot": True, "runAsUser": 2000, "runAsGroup": 3000})
    pod = by_kind(nonroot, "Job")[0]["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["fsGroup"] == 3000
    assert trainer_container(nonroot)["securityContext"]["runAsUser"] == 2000


def test_contract_1_values_reach_the_pods() -> None:
    values = {
        "image": {"repository": "111.dkr.ecr.eu-west-1.amazonaws.com/cdk-assets", "tag": "abc123"},
        "nodes": 5,
        "instanceType": "p5en.48xlarge",
        "gpusPerNode": 8,
        "efaPerNode": 16,
        "storage": {"claimName": "fsx-team-b", "localNvmePath": "/mnt/raid0", "mountPath": "/fsx"},
        "serviceAccountName": "trainer-b",
    }
    manifests = render(values)
    pod = by_kind(manifests, "Job")[0]["spec"]["template"]["spec"]
    container = trainer_container(manifests)
    assert container["image"] == "111.dkr.ecr.eu-west-1.amazonaws.com/cdk-assets:abc123"
    assert env_of(container)["NNODES"] == "5"
    assert pod["serviceAccountName"] == "trainer-b"
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["fsx"]["persistentVolumeClaim"]["claimName"] == "fsx-team-b"
    assert volumes["local-nvme"]["hostPath"]["path"] == "/mnt/raid0"
    # The helm test pods use the same claim and image.
    for test_pod in by_kind(manifests, "Pod"):
        assert test_pod["spec"]["containers"][0]["image"] == container["image"]
        volumes = test_pod["spec"]["volumes"]
        claims = [v["persistentVolumeClaim"]["claimName"] for v in volumes if "persistentVolumeClaim" in v]
        assert claims == ["fsx-team-b"]


def test_synthetic_data_init_container_matches_the_preset_vocabulary() -> None:
    values = {"syntheticTokens": 5000, "preset": "small", "seqLen": 2048}
    pod = by_kind(render(values), "Job")[0]["spec"]["template"]["spec"]
    # Data first: the config check looks for the data file; the node-health sidecar starts last.
    init, check, health = pod["initContainers"]
    assert (init["name"], check["name"], health["name"]) == ("synthetic-data", "check-config", "node-health")
    script = init["args"][0]
    assert (
        "python -m trainer.reference.data" in script
        and "--tokens 5000" in script
        and "--vocab 32000" in script
    )
    without = by_kind(render(), "Job")[0]["spec"]["template"]["spec"]["initContainers"]
    assert [c["name"] for c in without] == ["check-config", "node-health"]


def test_check_config_init_container_runs_the_trainers_own_flags(tmp_path: Path) -> None:
    """ft_launcher hides a worker's exit code 2, so the config is checked before it, with the same flags;
    the FailJob rule (no containerName) then covers this init container."""
    import subprocess
    import sys

    job = by_kind(render(), "Job")[0]
    pod = job["spec"]["template"]["spec"]
    check = next(c for c in pod["initContainers"] if c["name"] == "check-config")
    trainer = trainer_container(render())
    assert check["command"] == ["python", "-m", "trainer"]
    cut = check["args"].index("--")  # the reference entry point's options (the default) come last
    assert check["args"][cut - 1] == "--check-config"
    assert [*check["args"][: cut - 1], *check["args"][cut:]] == split(trainer["command"] + trainer["args"])[1]
    assert check["resources"] == trainer["resources"]
    rules = job["spec"]["podFailurePolicy"]["rules"]
    assert any(r["action"] == "FailJob" and "containerName" not in r["onExitCodes"] for r in rules)

    data = tmp_path / "tokens.npy"
    np.save(data, np.zeros(4096, dtype=np.uint16))

    def start_check(values: dict[str, Any]) -> subprocess.Popen[str]:
        # metricsPort 0: the check binds the port it is given, and the default 9400 may be a concurrent
        # test's.
        rendered = render({"metricsPort": 0, **values, "dataPath": str(data), "device": "cpu"})
        container = by_kind(rendered, "Job")[0]
        inits = container["spec"]["template"]["spec"]["initContainers"]
        check = next(c for c in inits if c["name"] == "check-config")
        env = env_of(check)
        argv = [expand(a, env) for a in check["args"]]
        return subprocess.Popen(
            [sys.executable, "-m", "trainer", *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    # Both checks run at once: each is mostly torch's import, so the pair costs about one.
    ok_check = start_check({"preset": "tiny", "seqLen": 128})
    # What only the trainer checks (its snapshot directory must not be the checkpoint directory) stops
    # here; extraTrainerArgs may add no flag the chart sets, so this one the chart leaves to the trainer.
    ckpt_dir = env_of(trainer_container(render({"preset": "tiny", "seqLen": 128})))["CHECKPOINT_DIR"]
    bad_check = start_check(
        {
            "preset": "tiny",
            "seqLen": 128,
            "snapshotInterval": 1,
            "extraTrainerArgs": [f"--snapshot-dir={ckpt_dir}"],
        }
    )
    ok_out, ok_err = ok_check.communicate(timeout=120)
    _, bad_err = bad_check.communicate(timeout=120)
    assert ok_check.returncode == 0, ok_err
    assert "config ok" in ok_out
    assert bad_check.returncode == 2, bad_err
    assert "snapshot_dir" in bad_err


def test_preset_vocabularies_mirror_the_trainer() -> None:
    from trainer.reference.model import PRESETS

    for preset, cfg in PRESETS.items():
        values = {"syntheticTokens": 10, "preset": preset, "seqLen": 128}
        pod = by_kind(render(values), "Job")[0]["spec"]["template"]["spec"]
        assert f"--vocab {cfg.vocab_size} " in pod["initContainers"][0]["args"][0], preset


def test_local_cpu_example_is_a_valid_trainer_config(tmp_path: Path) -> None:
    import yaml

    from tests.chart.helm import CHART

    local = yaml.safe_load((CHART / "examples" / "local-cpu.yaml").read_text())
    cfg = parse_trainer(tmp_path, local)
    assert cfg.timeouts.heartbeat_timeout == local["ftRankHeartbeatTimeout"]
    assert {f.kind for f in cfg.faults.specs} == {"exception", "sigkill"}
