"""Node liveness while a worker group starts (trainer/resilience/liveness.py): the worker's watch of its
round, and NVRx's initial barrier giving up on a node that stopped beating (trainer/resilience/inprocess.py:
WrapperStore) instead of waiting the whole barrier timeout. The launcher's beat on its own:
tests/trainer/launcher/test_beat.py.

The stores are real TCPStores on free local ports; the barrier is NVRx's own.
"""

from __future__ import annotations

import time
from datetime import timedelta

import pytest
import torch.distributed as dist
from nvidia_resiliency_ext.inprocess.store import BarrierTimeout

from trainer.launcher.beat import LauncherBeat
from trainer.resilience.inprocess import WrapperStore
from trainer.resilience.liveness import (
    LIVENESS_STORE_ENV,
    NodeLost,
    RoundWatch,
    liveness_key,
    lost_key,
    parse_endpoint,
)
from trainer.runtime.ports import free_port


def _master() -> tuple[dist.TCPStore, str]:
    port = free_port(span=1)
    store = dist.TCPStore(
        "127.0.0.1", port, is_master=True, timeout=timedelta(seconds=5), wait_for_workers=False
    )
    return store, f"127.0.0.1:{port}"


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_endpoints_are_host_and_port_and_the_field_is_named() -> None:
    assert parse_endpoint("pod-0.svc:29500") == ("pod-0.svc", 29500)
    assert parse_endpoint("[::1]:29500") == ("::1", 29500)
    for bad in ("pod-0.svc", "pod-0.svc:", ":29500", "host:port", "host:70000"):
        with pytest.raises(ValueError, match=f"^{LIVENESS_STORE_ENV}: expected host:port"):
            parse_endpoint(bad)


def test_the_watch_raises_for_a_node_that_stopped_beating_after_the_timeout() -> None:
    master, _ = _master()
    clock = FakeClock()
    watch = RoundWatch(master, cycle=2, group_world_size=3, own_group_rank=0, timeout_s=3.0, clock=clock)
    for group_rank in (1, 2):
        master.set(liveness_key(2, group_rank), "1")
    watch.check()
    for n in range(2, 6):  # node 1 keeps beating, node 2 stops after its first beat
        clock.now += 0.9
        master.set(liveness_key(2, 1), str(n))
        if clock.now - 100.0 < 3.0:
            watch.check()
    with pytest.raises(NodeLost, match="group rank 2 of rendezvous round 2 stopped beating"):
        watch.check()


def test_a_node_that_never_beats_is_lost_one_timeout_after_the_watch_began() -> None:
    master, _ = _master()
    master.set(liveness_key(1, 1), "7")  # last round's holder of group rank 1: a different key
    clock = FakeClock()
    watch = RoundWatch(master, cycle=2, group_world_size=2, own_group_rank=0, timeout_s=3.0, clock=clock)
    watch.check()
    clock.now += 2.9
    watch.check()  # a slow launcher still has time
    clock.now += 0.2
    with pytest.raises(NodeLost, match="group rank 1 of rendezvous round 2 never beat"):
        watch.check()


def test_a_node_that_beats_late_but_keeps_beating_is_not_lost() -> None:
    master, _ = _master()
    clock = FakeClock()
    watch = RoundWatch(master, cycle=0, group_world_size=2, own_group_rank=1, timeout_s=3.0, clock=clock)
    watch.check()
    clock.now += 2.5
    master.set(liveness_key(0, 0), "1")
    for n in range(2, 10):
        watch.check()
        clock.now += 1.0
        master.set(liveness_key(0, 0), str(n))
    watch.check()


def test_a_worker_that_does_not_watch_learns_of_the_lost_node_from_the_watchers_verdict() -> None:
    master, _ = _master()
    clock = FakeClock()
    kw = dict(cycle=2, group_world_size=3, timeout_s=3.0, clock=clock)
    watcher = RoundWatch(master, own_group_rank=0, watches_nodes=True, **kw)
    other = RoundWatch(master, own_group_rank=2, watches_nodes=False, **kw)
    master.set(liveness_key(2, 2), "1")  # node 2 beats once; node 1 never does
    for watch in (watcher, other):
        watch.check()
    clock.now += 3.5  # node 1 is overdue, but only a watcher reads the beats
    other.check()
    with pytest.raises(NodeLost, match="group rank 1 of rendezvous round 2 never beat") as found:
        watcher.check()
    assert master.get(lost_key(2)).decode() == str(found.value)
    with pytest.raises(NodeLost, match="group rank 1 of rendezvous round 2 never beat"):
        other.check()


def test_only_local_rank_0_of_the_first_two_nodes_watches(monkeypatch: pytest.MonkeyPatch) -> None:
    _, endpoint = _master()
    env = {LIVENESS_STORE_ENV: endpoint, "TORCHELASTIC_RESTART_COUNT": "1", "GROUP_WORLD_SIZE": "4"}
    roles = {
        (group, local): RoundWatch.from_env(3.0, {**env, "GROUP_RANK": str(group), "LOCAL_RANK": str(local)})
        for group in range(4)
        for local in range(2)
    }
    assert all(w is not None for w in roles.values())
    watchers = sorted(k for k, w in roles.items() if w is not None and w.watches_nodes)
    assert watchers == [(0, 0), (1, 0)]
    assert RoundWatch.from_env(3.0, {"GROUP_RANK": "0"}) is None  # not under trainer.launcher.ft


def _barrier_store(monkeypatch: pytest.MonkeyPatch, liveness_timeout: float | None) -> WrapperStore:
    """Rank 0's Wrapper store (its host) in a world of 2."""
    monkeypatch.setenv("RANK", "0")
    return WrapperStore(
        host_name="127.0.0.1",
        port=free_port(span=1),
        world_size=2,
        timeout=timedelta(seconds=30),
        liveness_timeout=liveness_timeout,
    )


def _round_env(monkeypatch: pytest.MonkeyPatch, endpoint: str, cycle: int = 5) -> None:
    monkeypatch.setenv(LIVENESS_STORE_ENV, endpoint)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", str(cycle))
    monkeypatch.setenv("GROUP_WORLD_SIZE", "2")
    monkeypatch.setenv("GROUP_RANK", "0")
    monkeypatch.setenv("LOCAL_RANK", "0")  # a watcher: local rank 0 of group rank 0


def test_the_initial_barrier_gives_up_on_a_lost_node_within_the_liveness_timeout(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rank 0 waits for rank 1, whose node beat once and was then lost: NodeLost after ~2 s, not the 60 s
    barrier timeout."""
    rdzv, endpoint = _master()
    _round_env(monkeypatch, endpoint)
    rdzv.set(liveness_key(5, 1), "1")
    store = _barrier_store(monkeypatch, liveness_timeout=2.0)
    start = time.monotonic()
    with pytest.raises(NodeLost, match="group rank 1 of rendezvous round 5 stopped beating"):
        store.initial_barrier(ranks=[0], rendezvous_count=2, timeout=timedelta(seconds=60))
    waited = time.monotonic() - start
    assert 2.0 <= waited < 5.0, waited


def test_the_initial_barrier_waits_for_a_node_that_keeps_beating(monkeypatch: pytest.MonkeyPatch) -> None:
    """A live node whose workers are slow to come is waited for: the barrier times out as NVRx's does."""
    _rdzv, endpoint = _master()  # kept: the rendezvous store's server lives as long as this reference
    _round_env(monkeypatch, endpoint)
    beat = LauncherBeat(endpoint, interval_s=0.2)
    beat.serve(cycle=5, group_rank=1)
    store = _barrier_store(monkeypatch, liveness_timeout=1.5)
    start = time.monotonic()
    try:
        with pytest.raises(BarrierTimeout):
            store.initial_barrier(ranks=[0], rendezvous_count=2, timeout=timedelta(seconds=4))
    finally:
        beat.stop()
    assert time.monotonic() - start >= 4.0


def test_the_initial_barrier_passes_when_every_rank_arrives(monkeypatch: pytest.MonkeyPatch) -> None:
    rdzv, endpoint = _master()
    _round_env(monkeypatch, endpoint)
    rdzv.set(liveness_key(5, 1), "1")
    store = _barrier_store(monkeypatch, liveness_timeout=2.0)
    store.initial_barrier(ranks=[0, 1], rendezvous_count=2, timeout=timedelta(seconds=10))  # both here


def test_without_a_beating_launcher_the_barrier_is_nvrx_own(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(LIVENESS_STORE_ENV, raising=False)
    store = _barrier_store(monkeypatch, liveness_timeout=1.0)
    start = time.monotonic()
    with pytest.raises(BarrierTimeout):
        store.initial_barrier(ranks=[0], rendezvous_count=2, timeout=timedelta(seconds=3))
    assert time.monotonic() - start >= 3.0
