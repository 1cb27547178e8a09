"""The job's rendezvous service (trainer/launcher/rendezvous.py) after a failed rendezvous: no pod's
supervisor takes the fresh rendezvous for a replaced service (which would restart ft_launcher in place,
past the Job's limits), and the reason is read where NVRx writes it. That the re-created pod completes the
run through the service is tests/bench/test_recovery_run.py's full restart (one faulted run for both)."""

from __future__ import annotations

import threading
import time
from typing import Any

from tests.helpers import free_port
from trainer.launcher.rendezvous import EPOCH_KEY, FOLLOWS_FAILURE_KEY, shutdown_reason
from trainer.launcher.supervise import wait_for_other_epoch, wait_past_failed_rendezvous


def _store(port: int, **keys: str) -> Any:
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
    for key, value in keys.items():
        store.set(key, value)
    return store


def test_the_fresh_rendezvous_after_a_failure_is_not_a_replaced_service() -> None:
    port = free_port()
    store = _store(port, **{EPOCH_KEY: "e2", FOLLOWS_FAILURE_KEY: "1"})
    assert wait_for_other_epoch(f"127.0.0.1:{port}", "e1", 1.0) is None
    store.delete_key(FOLLOWS_FAILURE_KEY)  # a service process started anew: replaced
    assert wait_for_other_epoch(f"127.0.0.1:{port}", "e1", 1.0) == "e2"


def test_the_shutdown_reason_is_read_where_nvrx_writes_it() -> None:
    from nvidia_resiliency_ext.fault_tolerance.ft_rendezvous_barrier import _RendezvousBarrierState

    port = free_port()
    store = _store(port)
    assert shutdown_reason(store, "job-a") is None
    state = _RendezvousBarrierState(store=store, run_id="job-a", is_store_host=True)
    state.set_shutdown("failure")
    assert shutdown_reason(store, "job-a") == "failure"
    assert shutdown_reason(store, "job-b") is None


def test_a_launcher_reaching_a_rendezvous_closed_by_a_failure_waits_for_the_fresh_one() -> None:
    """A pod re-created within the service's read grace reaches the closed store: its launcher must wait
    for the fresh one (another epoch) instead of joining the closed rendezvous, whose store then goes away.
    An open rendezvous, and one closed because the run completed, are joined at once."""
    from nvidia_resiliency_ext.fault_tolerance.ft_rendezvous_barrier import _RendezvousBarrierState

    port = free_port()
    endpoint = f"127.0.0.1:{port}"
    store = _store(port, **{EPOCH_KEY: "e1"})
    state = _RendezvousBarrierState(store=store, run_id="job-a", is_store_host=True)
    assert not wait_past_failed_rendezvous(endpoint, "job-a", 5.0)
    state.set_shutdown("failure")
    assert not wait_past_failed_rendezvous(endpoint, "job-b", 5.0)  # another job's rendezvous
    fresh = threading.Timer(0.5, lambda: store.set(EPOCH_KEY, "e2"))  # the service's next store
    fresh.start()
    started = time.monotonic()
    assert wait_past_failed_rendezvous(endpoint, "job-a", 10.0)
    assert 0.4 <= time.monotonic() - started < 5.0
    fresh.join()

    graceful_port = free_port()
    graceful = _store(graceful_port, **{EPOCH_KEY: "e3"})
    _RendezvousBarrierState(store=graceful, run_id="job-a", is_store_host=True).set_shutdown("graceful")
    started = time.monotonic()
    assert not wait_past_failed_rendezvous(f"127.0.0.1:{graceful_port}", "job-a", 5.0)
    assert time.monotonic() - started < 2.0


def test_a_launcher_that_hosts_the_store_does_not_wait_to_ask_it() -> None:
    """Nothing listens yet where a launcher will host the store itself (a local run): the check before it
    joins gives up at once, not after a store client's connect timeout (2 s of every such start)."""
    started = time.monotonic()
    assert not wait_past_failed_rendezvous(f"127.0.0.1:{free_port()}", "job-a", 5.0)
    assert time.monotonic() - started < 0.5
