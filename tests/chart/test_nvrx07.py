"""The chart's NVRx 0.7 surface: barrier rendezvous, hot spares, no-restart exit 93, progress tracking,
the Wrapper's liveness timeout. The launcher half is parsed by NVRx 0.7's own parser."""

from __future__ import annotations

from typing import Any

import pytest

from tests.chart.helm import by_kind, env_of, rejection, render, trainer_container
from tools.podcommand import launcher_argv
from tools.podspec import expand


def _launcher(values: dict[str, Any] | None = None) -> tuple[Any, Any, dict[str, str]]:
    """(parsed args, LaunchConfig, env) for the rendered pod command, through ft_launcher's own code."""
    from nvidia_resiliency_ext.fault_tolerance import launcher

    container = trainer_container(render(values))
    env = env_of(container)
    argv = launcher_argv([expand(a, env) for a in container["command"] + container["args"]])[1:]
    args = launcher.get_args_parser().parse_args(argv)
    config, _cmd, _cmd_args = launcher.config_from_args(args)
    return args, config, env


def _job_spec(values: dict[str, Any] | None = None) -> dict[str, Any]:
    (job,) = by_kind(render(values), "Job")
    return job["spec"]


@pytest.fixture(autouse=True)
def _omp(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # else config_from_args sets it in this process for good


def test_barrier_rendezvous_and_no_removed_flags() -> None:
    args, _config, _env = _launcher()
    assert args.ft_rdzv_impl == "barrier"
    rendered = " ".join(trainer_container(render())["args"])
    for removed in ("--ft-param-", "--restart-policy", "--fault-tol-cfg-path", "min-healthy"):
        assert removed not in rendered


@pytest.mark.parametrize(("nodes", "spares"), [(2, 0), (4, 1), (16, 2)])
def test_spare_nodes_run_as_extra_pods_and_widen_nnodes(nodes: int, spares: int) -> None:
    values = {"nodes": nodes, "spareNodes": spares, "podRetriesPerIndex": 2}
    _args, config, env = _launcher(values)
    assert (config.min_nodes, config.max_nodes) == (nodes, nodes + spares)
    assert env["NNODES"] == str(nodes) and env["MAX_NNODES"] == str(nodes + spares)
    spec = _job_spec(values)
    assert spec["completions"] == spec["parallelism"] == nodes + spares
    assert spec["backoffLimit"] == (nodes + spares) * 2


def test_no_restart_verdict_exits_93_and_93_fails_the_job() -> None:
    from nvidia_resiliency_ext.fault_tolerance.launcher import _no_restart_exit_code

    args, config, env = _launcher({"maxNoProgressCycles": 4})
    assert _no_restart_exit_code(args) == 93
    ft = config.fault_tol_cfg
    assert ft.max_no_progress_cycles == 4 and ft.is_progress_tracking_enabled
    # The file the trainer writes at every commit (trainer/resilience/progress.py).
    from trainer.resilience.progress import ITERATION_FILE

    assert ft.checkpoint_iteration_file == f"{env['CHECKPOINT_DIR']}/{ITERATION_FILE}"
    rules = _job_spec()["podFailurePolicy"]["rules"]
    fail_job = [r for r in rules if r["action"] == "FailJob"]
    assert any(93 in r["onExitCodes"]["values"] for r in fail_job)
    assert not _launcher({"maxNoProgressCycles": 0})[1].fault_tol_cfg.is_progress_tracking_enabled


def test_liveness_timeout_reaches_the_trainer_and_must_nest() -> None:
    container = trainer_container(render({"inprocessLivenessTimeout": 12}))
    assert "--inprocess-liveness-timeout=12" in container["args"]
    assert "inprocessLivenessTimeout (400 s) must not exceed inprocessHardTimeout (300 s)" in rejection(
        {"inprocessLivenessTimeout": 400}
    )
    assert "must exceed the Wrapper's 1 s heartbeat interval" in rejection({"inprocessLivenessTimeout": 1})
    assert "spareNodes" in rejection({"spareNodes": -1})


def test_cluster_defaults_notice_a_lost_node_within_15_s() -> None:
    """Liveness defaults do not depend on step time: the Wrapper's heartbeat timeout plus its 1 s beat."""
    from trainer.resilience.timeouts import Timeouts

    container = trainer_container(render())
    flag = next(a for a in container["args"] if a.startswith("--inprocess-liveness-timeout="))
    liveness = float(flag.split("=", 1)[1])
    assert liveness + Timeouts().heartbeat_interval <= 15
