"""The NVRx launcher patches (trainer/launcher/patches.py) on the installed NVRx, and the pod command's way
into them (trainer/launcher/__main__.py -> trainer/launcher/ft.py).

Each patch has a canary here, a test of NVRx as shipped that fails once NVRx fixes what the patch works
around (then drop the patch and its report): `test_nvrx_terminate_as_shipped_sleeps_with_no_group_left`,
`test_nvrx_step_0_as_shipped_sleeps_a_second_first` (docs/nvrx-restart-sleeps.md) and
`test_nvrx_barrier_rendezvous_still_sends_no_keep_alives` (docs/nvrx-no-liveness-after-round.md).

NVRx 0.7's `terminate_mp_processes` sleeps 1 s after signalling the worker process groups even when none
is left. Here its sleep is recorded instead of slept, so each test shows whether NVRx's grace period
would have run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import types
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT as REPO
from trainer.launcher.patches import (
    GRACE_THREAD_TARGET,
    beat_after_rendezvous,
    no_exit_grace_alone,
    skip_idle_group_grace,
)


@pytest.fixture
def launcher(monkeypatch: pytest.MonkeyPatch) -> tuple[types.ModuleType, list[float]]:
    """NVRx's launcher module with the workaround applied (undone after the test) and its utils' sleeps
    recorded instead of slept."""
    from nvidia_resiliency_ext.fault_tolerance import launcher as module
    from nvidia_resiliency_ext.fault_tolerance import utils

    slept: list[float] = []
    monkeypatch.setattr(utils.time, "sleep", slept.append)
    monkeypatch.setattr(module, "terminate_mp_processes", module.terminate_mp_processes)
    assert skip_idle_group_grace(module)  # the installed NVRx has the function it wraps
    return module, slept


def _gone_group() -> int:
    proc = subprocess.Popen(["true"], start_new_session=True)
    proc.wait()
    return proc.pid  # its own session: the group id is its pid, and nothing is left in it


def test_no_grace_period_when_every_worker_group_is_gone(
    launcher: tuple[types.ModuleType, list[float]],
) -> None:
    module, slept = launcher
    module.terminate_mp_processes(allowed_pgids={_gone_group(), _gone_group()})
    assert slept == []


def test_a_group_still_there_gets_nvrx_own_sigterm_grace_and_sigkill(
    launcher: tuple[types.ModuleType, list[float]],
) -> None:
    module, slept = launcher
    ignore_sigterm = (
        "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
        "print(1, flush=True); time.sleep(60)"
    )
    stubborn = subprocess.Popen(
        [sys.executable, "-c", ignore_sigterm], start_new_session=True, stdout=subprocess.PIPE
    )
    assert stubborn.stdout is not None and stubborn.stdout.readline()  # its SIGTERM handler is in place
    try:
        module.terminate_mp_processes(allowed_pgids={_gone_group(), stubborn.pid})
        assert slept == [1.0]  # NVRx's grace period ran: a group was left
        assert stubborn.wait(timeout=10) == -signal.SIGKILL  # ignored SIGTERM, then NVRx's SIGKILL
    finally:
        if stubborn.poll() is None:
            os.killpg(stubborn.pid, signal.SIGKILL)


def test_nvrx_terminate_as_shipped_sleeps_with_no_group_left(monkeypatch: pytest.MonkeyPatch) -> None:
    """Canary of `skip_idle_group_grace`: NVRx's own function, unpatched, still sleeps its 1 s grace when
    every worker group is already gone (fails once NVRx stops sleeping there: then drop the patch)."""
    from nvidia_resiliency_ext.fault_tolerance import utils

    slept: list[float] = []
    monkeypatch.setattr(utils.time, "sleep", slept.append)
    utils.terminate_mp_processes(allowed_pgids={_gone_group(), _gone_group()})
    assert slept == [1.0]


def test_patching_twice_wraps_once(launcher: tuple[types.ModuleType, list[float]]) -> None:
    module, _ = launcher
    first = module.terminate_mp_processes
    assert skip_idle_group_grace(module)
    assert module.terminate_mp_processes is first


def test_an_nvrx_without_the_function_runs_as_shipped() -> None:
    assert not skip_idle_group_grace(types.ModuleType("launcher_without_it"))


def test_the_prefork_wrapper_runs_ft_launcher_through_the_workaround(tmp_path: Path) -> None:
    """`python -m trainer.launcher ft_launcher --help` with a stand-in `ft_launcher` script first on PATH:
    exec'd directly it would print its marker; through trainer.launcher.ft, NVRx's own main runs
    (its usage), with the script's path as argv[0] (the usage names ft_launcher)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "ft_launcher"
    script.write_text(f"#!{sys.executable}\nprint('STAND-IN SCRIPT')\n")
    script.chmod(0o755)
    out = subprocess.run(
        [sys.executable, "-m", "trainer.launcher", "ft_launcher", "--help"],
        cwd=REPO,
        env={**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "TMPDIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert "STAND-IN SCRIPT" not in out.stdout
    assert out.stdout.startswith("usage: ft_launcher") and "--ft-" in out.stdout, out.stdout[:500]


# -- Step 0 of the barrier rendezvous: NVRx's own state class on a real TCPStore, its sleeps recorded.


@pytest.fixture
def barrier(monkeypatch: pytest.MonkeyPatch) -> tuple[types.ModuleType, list[float]]:
    from nvidia_resiliency_ext.fault_tolerance import ft_rendezvous_barrier as module

    slept: list[float] = []
    monkeypatch.setattr(module.time, "sleep", slept.append)
    state = module._RendezvousBarrierState
    monkeypatch.setattr(state, "_wait_for_rendezvous_open", state._wait_for_rendezvous_open)
    return module, slept


def _round_1_opened(module: types.ModuleType) -> object:
    """A node's rendezvous state after round 0 closed and a launcher that saw a failure opened round 1."""
    from datetime import timedelta

    import torch.distributed as dist

    from trainer.runtime.ports import free_port

    store = dist.TCPStore("127.0.0.1", free_port(span=1), is_master=True, timeout=timedelta(seconds=5))
    state = module._RendezvousBarrierState(store, "step0-test", is_store_host=True)
    store.set(f"{state.prefix}:round_done_0", b"1")
    state.open_rendezvous()
    state._last_stale_check_time = 0.0  # as perform_rendezvous leaves it before Step 0
    return state


def test_step_0_joins_an_open_round_without_sleeping(barrier: tuple[types.ModuleType, list[float]]) -> None:
    from trainer.launcher.patches import sync_before_round_wait

    module, slept = barrier
    assert sync_before_round_wait(module)
    assert sync_before_round_wait(module)  # patching twice wraps once
    state = _round_1_opened(module)
    state._wait_for_rendezvous_open(module._NodeDesc("node", 1, 0))
    assert state._round == 1
    assert slept == []


def test_nvrx_step_0_as_shipped_sleeps_a_second_first(barrier: tuple[types.ModuleType, list[float]]) -> None:
    """What the workaround removes (fails once NVRx stops sleeping there: then drop the workaround)."""
    module, slept = barrier
    state = _round_1_opened(module)
    state._wait_for_rendezvous_open(module._NodeDesc("node", 1, 0))
    assert state._round == 1
    assert slept == [1.0]


# -- The agent's rendezvous step: the node beat paused in a rendezvous, served once a round made it active.


class _Agent:
    def __init__(self, round_id: int) -> None:
        self._rdzv_handler = types.SimpleNamespace(round=lambda: round_id)
        self.calls: list[str] = []

    def _rendezvous(self, worker_group: object) -> str:
        self.calls.append("rendezvous")
        return "done"


class _RecordingBeat:
    def __init__(self) -> None:
        self.events: list[tuple] = []

    def pause(self) -> None:
        self.events.append(("pause",))

    def serve(self, cycle: int, group_rank: int) -> None:
        self.events.append(("serve", cycle, group_rank))


def test_the_launcher_pauses_its_beat_in_a_rendezvous_and_serves_the_round_it_got() -> None:
    module = types.SimpleNamespace(LocalElasticAgent=type("Agent", (_Agent,), {}))
    beat = _RecordingBeat()
    assert beat_after_rendezvous(module, beat)
    assert beat_after_rendezvous(module, beat)  # patching twice wraps once
    agent = module.LocalElasticAgent(round_id=4)
    assert agent._rendezvous(types.SimpleNamespace(group_rank=1)) == "done"
    assert agent.calls == ["rendezvous"]
    assert beat.events == [("pause",), ("serve", 4, 1)]
    assert not beat_after_rendezvous(types.SimpleNamespace(), beat)  # an NVRx without the agent method


def test_the_installed_nvrx_has_what_the_beat_hooks_into() -> None:
    """An NVRx upgrade that renames the agent's rendezvous step or the handler's round fails here."""
    from nvidia_resiliency_ext.fault_tolerance import launcher
    from nvidia_resiliency_ext.fault_tolerance.ft_rendezvous_barrier import FtRendezvousBarrierHandler

    assert callable(getattr(launcher.LocalElasticAgent, "_rendezvous", None))
    assert callable(getattr(FtRendezvousBarrierHandler, "round", None))


def test_nvrx_barrier_rendezvous_still_sends_no_keep_alives() -> None:
    """Canary of `beat_after_rendezvous` and the node beat: NVRx's barrier rendezvous declares keep-alive
    settings but nothing reads them, so no launcher learns that a member of a closed round is gone. Fails
    once NVRx reads them (keep-alives implemented): then check whether the beat is still needed."""
    import inspect

    from nvidia_resiliency_ext.fault_tolerance import ft_rendezvous_barrier

    source = inspect.getsource(ft_rendezvous_barrier)
    assert "keep_alive_interval: timedelta" in source  # the setting is still declared ...
    assert ".keep_alive_interval" not in source and ".keep_alive_max_attempt" not in source  # ... unread


def test_nvrx_store_host_as_shipped_waits_3_s_at_exit() -> None:
    """Canary: the launcher that hosts the store waits a fixed 3 s in a `_wait_grace` thread before it
    exits, whatever the job's size. Fails once NVRx changes that: review `no_exit_grace_alone` then."""
    import inspect

    from nvidia_resiliency_ext.fault_tolerance import launcher as module

    source = inspect.getsource(module.launch_agent)
    assert "grace_period = 3.0" in source
    assert f"def {GRACE_THREAD_TARGET}()" in source and "time.sleep(grace_period)" in source


def _slept_in_thread(module: types.ModuleType, target_name: str, seconds: float) -> float:
    import threading
    import time

    def target() -> None:
        module.time.sleep(seconds)

    target.__name__ = target_name  # the thread is named after it, as NVRx's grace thread is
    thread = threading.Thread(target=target, daemon=True)
    started = time.monotonic()
    thread.start()
    thread.join()
    return time.monotonic() - started


def test_a_one_node_store_host_exits_without_the_grace_and_other_sleeps_are_real(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from nvidia_resiliency_ext.fault_tolerance import launcher as module

    monkeypatch.setattr(module, "time", module.time)  # undone after the test
    assert not no_exit_grace_alone(module, max_nodes=2)  # a multi-node job keeps NVRx's wait
    assert not no_exit_grace_alone(module, max_nodes=None)  # so does a job of unknown size
    assert _slept_in_thread(module, GRACE_THREAD_TARGET, 0.3) >= 0.3
    assert no_exit_grace_alone(module, max_nodes=1) and no_exit_grace_alone(module, max_nodes=1)
    assert _slept_in_thread(module, GRACE_THREAD_TARGET, 3.0) < 0.5
    assert _slept_in_thread(module, "monitor", 0.3) >= 0.3  # any other thread's sleep is the real one
    assert module.time.monotonic() > 0  # the rest of time is the real module's
