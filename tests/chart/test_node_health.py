"""The chart's node health wiring: the node-health native sidecar (its arguments parsed by the daemon's
own parser, its startup probe on the same socket ft_launcher is given), ft_launcher's node health options
parsed by NVRx 0.7's own parser, the values off and on, and bad values refused naming the value."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.chart.helm import env_of, rejection, render, trainer_container, workload_pod_spec
from tools.podcommand import launcher_argv
from tools.podspec import expand
from trainer.config.flags import FlagParser
from trainer.health.config import HealthConfig, add_health_arguments, health_config

SOCKET = "/run/trainer-health/health.sock"


def sidecar(values: dict[str, Any] | None = None) -> dict[str, Any] | None:
    inits = workload_pod_spec(render(values)).get("initContainers", [])
    found = [c for c in inits if c["name"] == "node-health"]
    return found[0] if found else None


def launcher_args(values: dict[str, Any] | None = None) -> Any:
    """ft_launcher's parsed arguments and the rendezvous config NVRx builds from them."""
    from nvidia_resiliency_ext.fault_tolerance import launcher

    container = trainer_container(render(values))
    env = env_of(container)
    argv = launcher_argv([expand(a, env) for a in container["command"] + container["args"]])[1:]
    args = launcher.get_args_parser().parse_args(argv)
    config, _cmd, _cmd_args = launcher.config_from_args(args)
    return args, config


@pytest.fixture(autouse=True)
def _omp(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # else config_from_args sets it in this process for good


def test_the_sidecar_starts_last_among_the_init_containers_and_serves_the_launchers_socket() -> None:
    pod = workload_pod_spec(render())
    inits = pod["initContainers"]
    assert inits[-1]["name"] == "node-health" and inits[-1]["restartPolicy"] == "Always"
    side = inits[-1]
    assert side["command"] == ["python", "-m", "trainer.health"]
    assert side["startupProbe"]["exec"]["command"] == [
        "python",
        "-m",
        "trainer.health",
        "probe",
        "--socket",
        SOCKET,
    ]
    parser = FlagParser()
    add_health_arguments(parser)
    cfg = health_config(parser.parse_args([expand(a, env_of(side)) for a in side["args"]]))
    trainer = trainer_container(render())
    out_dir = env_of(trainer)["OUT_DIR"]
    assert cfg == HealthConfig(
        socket=Path(SOCKET),
        storage_path=Path(out_dir),
        storage_deadline_s=10.0,
        nvme_path=Path("/local-nvme"),
        nvme_min_free_gib=10.0,
        gpus=8,
        efa_devices=32,
        tool_timeout_s=20.0,
    )
    # One emptyDir holds the socket; both containers mount it at the same place.
    mounts = {c["name"]: {m["name"]: m["mountPath"] for m in c["volumeMounts"]} for c in (side, trainer)}
    assert mounts["node-health"]["node-health"] == mounts["trainer"]["node-health"] == "/run/trainer-health"
    (volume,) = [v for v in pod["volumes"] if v["name"] == "node-health"]
    assert "emptyDir" in volume
    assert side["securityContext"] == trainer["securityContext"]  # the same uid: the socket is 0600


def test_ft_launcher_gets_the_endpoint_the_lustre_check_and_the_cycle_dir() -> None:
    args, config = launcher_args()
    assert args.ft_node_health_check_endpoint == SOCKET
    assert config.rdzv_configs["enable_dist_storage_healthcheck"] is True
    assert "storage_healthcheck_paths" not in config.rdzv_configs  # nodeHealthPathCheck is off
    out_dir = env_of(trainer_container(render()))["OUT_DIR"]
    assert args.ft_cycle_info_dir == f"{out_dir}/nvrx-cycles"


def test_the_path_check_names_the_fsx_mount_when_asked_for() -> None:
    _args, config = launcher_args({"nodeHealthPathCheck": True, "storage": {"mountPath": "/lustre"}})
    assert config.rdzv_configs["storage_healthcheck_paths"] == ["/lustre"]


def test_node_health_off_renders_neither_the_sidecar_nor_its_options() -> None:
    assert sidecar({"nodeHealth": False}) is None
    args, config = launcher_args({"nodeHealth": False})
    assert args.ft_node_health_check_endpoint is None
    assert "enable_dist_storage_healthcheck" not in config.rdzv_configs
    mounts = [m["name"] for m in trainer_container(render({"nodeHealth": False}))["volumeMounts"]]
    assert "node-health" not in mounts


def test_gpu_nodes_let_the_sidecar_see_the_gpus_and_cpu_nodes_do_not() -> None:
    gpu = sidecar()
    assert gpu is not None and env_of(gpu)["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert env_of(gpu)["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    cpu = sidecar({"device": "cpu", "gpusPerNode": 1, "efaPerNode": 0})
    assert cpu is not None and "NVIDIA_VISIBLE_DEVICES" not in env_of(cpu)
    assert "--gpus=1" in cpu["args"] and "--efa-devices=0" in cpu["args"]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"nodeHealthStorageDeadline": 0}, "at '/nodeHealthStorageDeadline': exclusiveMinimum"),
        ({"nodeHealthStorageDeadline": "10s"}, "at '/nodeHealthStorageDeadline': got string, want number"),
        ({"nodeHealthNvmeMinFreeGiB": -1}, "at '/nodeHealthNvmeMinFreeGiB': minimum: got -1"),
        ({"nodeHealth": "yes"}, "at '/nodeHealth': got string, want boolean"),
        ({"nodeHealthPathCheck": 1}, "at '/nodeHealthPathCheck': got number, want boolean"),
    ],
)
def test_bad_node_health_values_are_refused_naming_the_value(values: dict[str, Any], message: str) -> None:
    stderr = rejection(values)
    assert message in stderr, stderr
    assert stderr.count("- at '") == 1, stderr  # one refusal, naming the value
