"""The rendezvous' polls (trainer/launcher/patches.py `quick_rendezvous_polls`): NVRx's store host and its
launchers wait a second between looks at the round; the service, which only watches, looks every 50 ms, and
a launcher (a standby spare) every 50 ms in a small job, scaled back to 1 s at 2,000 nodes."""

from __future__ import annotations

import inspect
import time
import types

import pytest

from trainer.launcher.patches import HOST_POLL_S, launcher_poll_s, max_nodes, quick_rendezvous_polls


@pytest.fixture
def barrier(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    from nvidia_resiliency_ext.fault_tolerance import ft_rendezvous_barrier as module

    state = module._RendezvousBarrierState
    monkeypatch.setattr(module, "time", module.time)  # both undone after the test
    monkeypatch.setattr(state, "_compute_step2_poll_interval", state.__dict__["_compute_step2_poll_interval"])
    return module


def test_nvrx_host_polls_as_shipped_wait_a_second(barrier: types.ModuleType) -> None:
    """Canary: Step 0 sleeps 1 s between looks for an opened round and Step 2 polls a small round once a
    second. Fails once NVRx polls faster: drop the patch then."""
    state = barrier._RendezvousBarrierState
    assert state._compute_step2_poll_interval(16, 5.0) == 1.0
    assert "time.sleep(1.0)" in inspect.getsource(state._wait_for_rendezvous_open)


def test_patched_polls_are_quick_for_small_rounds_and_nvrx_own_at_scale(barrier: types.ModuleType) -> None:
    assert quick_rendezvous_polls(barrier) and quick_rendezvous_polls(barrier)  # patches once
    state = barrier._RendezvousBarrierState
    assert state._compute_step2_poll_interval(16, 5.0) == HOST_POLL_S
    assert state._compute_step2_poll_interval(2000, 5.0) == 1.0
    assert state._compute_step2_poll_interval(20000, 5.0) == 5.0  # capped by segment_check_interval
    started = time.monotonic()
    barrier.time.sleep(1.0)  # what Step 0 asks for
    assert time.monotonic() - started < 0.5
    assert barrier.time.monotonic() > 0  # the rest of time is the real module's


def test_a_launcher_polls_quickly_in_a_small_job_and_as_nvrx_at_scale() -> None:
    # A standby spare waits in Step 0 while the job trains; a node loss's round closes only once it looked.
    assert launcher_poll_s(max_nodes(["--nnodes=2:3", "--nproc-per-node=2"])) == HOST_POLL_S
    assert launcher_poll_s(max_nodes(["--nnodes", "200:210"])) == pytest.approx(0.105)
    assert launcher_poll_s(max_nodes(["--nnodes=2000"])) == 1.0
    assert launcher_poll_s(max_nodes(["--nnodes=16:20000"])) == 1.0  # never slower than NVRx
    assert launcher_poll_s(max_nodes(["--nproc-per-node=8"])) == 1.0  # unknown size: NVRx's own


def test_the_launcher_entry_point_patches_its_rendezvous_polls() -> None:
    """trainer/launcher/ft.py, which runs ft_launcher in its own process, installs the quick polls with
    the job's size (read from the launcher's command line)."""
    import trainer.launcher.ft as ft

    source = inspect.getsource(ft.main)
    assert "quick_rendezvous_polls(ft_rendezvous_barrier, launcher_poll_s(max_nodes(" in source
