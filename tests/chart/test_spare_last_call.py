"""rdzvLastCallTimeout: how long a restart round waits for a previous active node before a hot spare takes
its place, passed as NVRx 0.7's rendezvous `last_call_timeout` and read back by NVRx's own code."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from tests.chart.helm import env_of, rejection, render, trainer_container
from tools.podcommand import launcher_argv
from tools.podspec import expand


def _last_call(values: dict[str, Any] | None = None) -> timedelta:
    from nvidia_resiliency_ext.fault_tolerance import ft_rendezvous_barrier, launcher
    from torch.distributed.elastic.rendezvous import RendezvousParameters

    container = trainer_container(render(values))
    env = env_of(container)
    argv = launcher_argv([expand(a, env) for a in container["command"] + container["args"]])[1:]
    args = launcher.get_args_parser().parse_args(argv)
    config, _cmd, _cmd_args = launcher.config_from_args(args)
    params = RendezvousParameters("c10d", "127.0.0.1:1", "run", 2, 3, **config.rdzv_configs)
    timeout = ft_rendezvous_barrier._get_timeout(params, "last_call")
    assert timeout is not None
    # NVRx's own check: the last call may be 0 (no wait), never negative.
    ft_rendezvous_barrier.RendezvousTimeout(last_call=timeout)
    return timeout


@pytest.fixture(autouse=True)
def _omp(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # else config_from_args sets it in this process for good


def test_last_call_keeps_nvrx_default_and_reaches_the_rendezvous() -> None:
    assert _last_call({"spareNodes": 1}) == timedelta(seconds=1)
    assert _last_call({"spareNodes": 1, "rdzvLastCallTimeout": 0}) == timedelta(0)


def test_last_call_must_be_a_non_negative_integer() -> None:
    assert "rdzvLastCallTimeout" in rejection({"rdzvLastCallTimeout": -1})
    assert "rdzvLastCallTimeout" in rejection({"rdzvLastCallTimeout": 0.5})
