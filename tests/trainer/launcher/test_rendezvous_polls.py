"""The rendezvous service's polls (trainer/launcher/patches.py `quick_host_polls`): NVRx's store host waits
a second between looks at the round; the service, which only watches, looks every 50 ms."""

from __future__ import annotations

import inspect
import time
import types

import pytest

from trainer.launcher.patches import HOST_POLL_S, quick_host_polls


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
    assert quick_host_polls(barrier) and quick_host_polls(barrier)  # patches once
    state = barrier._RendezvousBarrierState
    assert state._compute_step2_poll_interval(16, 5.0) == HOST_POLL_S
    assert state._compute_step2_poll_interval(2000, 5.0) == 1.0
    assert state._compute_step2_poll_interval(20000, 5.0) == 5.0  # capped by segment_check_interval
    started = time.monotonic()
    barrier.time.sleep(1.0)  # what Step 0 asks for
    assert time.monotonic() - started < 0.5
    assert barrier.time.monotonic() > 0  # the rest of time is the real module's
