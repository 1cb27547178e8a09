"""A lost pod recorded at once (trainer/resilience/lostpods.py, inprocess.py `LostPodWatch`): the probe's
three outcomes, the map from a node's group rank to its global ranks under hot spares and group-rank
shifts, the probing loop, and the record it makes in NVRx's own barriers. The run that shows a survivor
leaving in under 2 s with a 15 s liveness timeout: test_node_loss.py.

Stores are real TCPStores on free local ports; the barriers are NVRx's own."""

from __future__ import annotations

import socket
import threading
import time
from datetime import timedelta
from typing import Any

import pytest
import torch.distributed as dist
from nvidia_resiliency_ext.inprocess.store import PrefixStore

from trainer.launcher.beat import LauncherBeat
from trainer.launcher.presence import PresenceListener
from trainer.resilience import lostpods
from trainer.resilience.inprocess import (
    ITERATION_SETTLED_KEY,
    LauncherWrapperStore,
    LostPodWatch,
    record_lost_ranks,
)
from trainer.resilience.liveness import LIVENESS_STORE_ENV, presence_key
from trainer.resilience.lostpods import LostPodProbe, Presence, RoundLayout, probe, probe_allowed
from trainer.resilience.timeouts import Timeouts
from trainer.runtime.ports import free_port


def _master() -> tuple[dist.TCPStore, str]:
    port = free_port(span=1)
    store = dist.TCPStore(
        "127.0.0.1", port, is_master=True, timeout=timedelta(seconds=5), wait_for_workers=False
    )
    return store, f"127.0.0.1:{port}"


def _closed_port() -> int:
    """A port nothing listens on (bound a moment ago, then closed)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# ------------------------------------------------------------------ the probe: refused, answered, unknown


def test_a_refused_connection_means_gone_and_an_open_listener_means_there() -> None:
    listener = PresenceListener()
    address = f"127.0.0.1:{listener.port}"
    try:
        for _ in range(3):  # answered again and again: the listener accepts and closes each connection
            assert probe(address) is Presence.THERE
    finally:
        listener.close()
    assert probe(address) is Presence.GONE  # the pod's main process closed it: nothing listens there
    assert probe(f"127.0.0.1:{_closed_port()}") is Presence.GONE


def test_a_timeout_or_any_other_error_means_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    def times_out(*_: Any, **__: Any) -> socket.socket:
        raise TimeoutError("timed out")

    monkeypatch.setattr(lostpods.socket, "create_connection", times_out)
    assert probe("10.0.0.7:4000") is Presence.UNKNOWN
    monkeypatch.undo()
    # A connection that is never answered (a full backlog: the kernel drops the SYN) times out for real.
    with socket.socket() as full:
        full.bind(("127.0.0.1", 0))
        full.listen(0)
        address = f"127.0.0.1:{full.getsockname()[1]}"
        held = []
        try:
            while len(held) < 8:  # fill the accept queue until a connection is no longer answered
                try:
                    held.append(socket.create_connection(("127.0.0.1", full.getsockname()[1]), timeout=0.3))
                except TimeoutError:
                    break
            started = time.monotonic()
            outcomes = {probe(address, timeout_s=0.3) for _ in range(2)}
            assert time.monotonic() - started < 2.0
        finally:
            for sock in held:
                sock.close()
    assert len(held) < 8 and outcomes == {Presence.UNKNOWN}, (len(held), outcomes)
    assert probe("no-such-host.invalid:4000") is Presence.UNKNOWN
    assert probe("not an address") is Presence.UNKNOWN


def test_a_loopback_address_is_trusted_only_by_a_prober_on_the_loopback() -> None:
    # A publisher that reaches the store over the loopback publishes 127.0.0.1; from another host that is
    # the prober's own loopback, where a refusal says nothing about the publisher.
    assert probe_allowed("127.0.0.1:4000", own_host="127.0.0.1")
    assert probe_allowed("[::1]:4000", own_host="::1")
    assert not probe_allowed("127.0.0.1:4000", own_host="10.0.3.7")
    assert not probe_allowed("localhost:4000", own_host="10.0.3.7")
    assert probe_allowed("10.0.3.8:4000", own_host="10.0.3.7")
    assert not probe_allowed("garbage", own_host="127.0.0.1")


# ------------------------------------------------------------------ group rank -> global ranks


def _env(cycle: int, group: int, groups: int, local: int, nproc: int, **over: str) -> dict[str, str]:
    env = {
        "TORCHELASTIC_RESTART_COUNT": str(cycle),
        "GROUP_RANK": str(group),
        "GROUP_WORLD_SIZE": str(groups),
        "LOCAL_WORLD_SIZE": str(nproc),
        "LOCAL_RANK": str(local),
        "RANK": str(group * nproc + local),
        "WORLD_SIZE": str(groups * nproc),
    }
    return {**env, **over}


def test_a_node_holds_the_global_ranks_of_its_group_rank_in_this_round() -> None:
    layout = RoundLayout.from_env(_env(cycle=2, group=1, groups=3, local=2, nproc=4))
    assert layout == RoundLayout(cycle=2, group_rank=1, group_world_size=3, local_world_size=4, local_rank=2)
    assert list(layout.ranks_of(0)) == [0, 1, 2, 3]
    assert list(layout.ranks_of(2)) == [8, 9, 10, 11]
    assert layout.probed_nodes() == [2, 0]
    assert RoundLayout.from_env(_env(0, 3, 4, 0, 1)).probed_nodes() == [0, 1]  # type: ignore[union-attr]
    assert RoundLayout.from_env(_env(0, 0, 2, 0, 8)).probed_nodes() == [1]  # type: ignore[union-attr]
    assert RoundLayout.from_env(_env(0, 0, 1, 0, 8)).probed_nodes() == []  # type: ignore[union-attr]


def test_ranks_not_laid_out_by_group_rank_turn_the_probe_off() -> None:
    # Hot spares are not in WORLD_SIZE (ft_launcher counts active nodes only): a world that also counted
    # them, or a rank that is not group rank x local world size + local rank, is not this layout.
    assert RoundLayout.from_env(_env(1, 1, 2, 0, 4, WORLD_SIZE="12")) is None
    assert RoundLayout.from_env(_env(1, 1, 2, 0, 4, RANK="0")) is None
    assert RoundLayout.from_env(_env(1, 2, 2, 0, 4)) is None
    env = _env(1, 1, 2, 0, 4)
    del env["GROUP_RANK"]
    assert RoundLayout.from_env(env) is None


def test_after_a_shift_the_prober_records_the_ranks_the_gone_pod_holds_in_this_round() -> None:
    """Round 1: pods a, b, c at group ranks 0, 1, 2 (2 ranks each), spare s standing by. b is lost; round
    2 has a at 0, c shifted down to 1 (docs/nvrx-group-rank-shift.md) and s at 2. Then c's pod is lost:
    a, probing in round 2, must record ranks 2 and 3 (c's ranks now), never 4 and 5 (c's ranks in round
    1), and must not take round 1's key for group rank 1 (b's closed listener) for c."""
    master, endpoint = _master()
    pods = {name: PresenceListener() for name in "abcs"}
    beats = {name: LauncherBeat(endpoint, interval_s=60, presence=pods[name].port) for name in "abcs"}
    try:
        for name, group_rank in (("a", 0), ("b", 1), ("c", 2)):
            beats[name].serve(cycle=1, group_rank=group_rank)
        pods["b"].close()
        for name, group_rank in (("a", 0), ("c", 1), ("s", 2)):
            beats[name].serve(cycle=2, group_rank=group_rank)
        for cycle, group_rank in ((1, 1), (2, 0), (2, 1), (2, 2)):
            master.wait([presence_key(cycle, group_rank)], timedelta(seconds=2))
        assert master.get(presence_key(2, 1)).decode() == f"127.0.0.1:{pods['c'].port}"
        pods["c"].close()
        layout = RoundLayout.from_env(_env(cycle=2, group=0, groups=3, local=0, nproc=2))
        assert layout is not None
        recorded: list[list[int]] = []

        def address(group_rank: int) -> str | None:
            key = presence_key(layout.cycle, group_rank)
            return master.get(key).decode() if master.check([key]) else None

        gone = LostPodProbe(
            layout=layout,
            own_host="127.0.0.1",
            address=address,
            record=recorded.append,
            settled=lambda: bool(recorded),
            deadline_s=2.0,
        ).run()
        assert gone == [1] and recorded == [[2, 3]]
    finally:
        for name in "abcs":
            beats[name].stop()
            pods[name].close()


# ------------------------------------------------------------------ the probing loop


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def _loop(answers: dict[str, list[Presence]], settled_after: int | None = None) -> tuple[list[int], list]:
    """A LostPodProbe of node 0 in a round of 3 nodes x 2 ranks, with scripted answers per address."""
    clock = _Clock()
    recorded: list[list[int]] = []
    probes: list[str] = []

    def answer(address: str) -> Presence:
        probes.append(address)
        script = answers[address]
        return script.pop(0) if len(script) > 1 else script[0]

    layout = RoundLayout(cycle=0, group_rank=0, group_world_size=3, local_world_size=2, local_rank=0)
    gone = LostPodProbe(
        layout=layout,
        own_host="10.0.0.1",
        address=lambda g: f"10.0.0.{g + 1}:7000",
        record=recorded.append,
        settled=lambda: settled_after is not None and len(probes) >= settled_after,
        deadline_s=1.0,
        interval_s=0.1,
        probe=answer,
        clock=clock,
        sleep=clock.sleep,
    ).run()
    return gone, recorded


def test_a_pod_that_still_answers_while_it_dies_is_recorded_once_its_listener_is_gone() -> None:
    gone, recorded = _loop(
        {"10.0.0.2:7000": [Presence.THERE, Presence.THERE, Presence.GONE], "10.0.0.3:7000": [Presence.THERE]}
    )
    assert gone == [1] and recorded == [[2, 3]]


def test_answers_and_unknowns_record_nothing_until_the_deadline() -> None:
    gone, recorded = _loop({"10.0.0.2:7000": [Presence.THERE], "10.0.0.3:7000": [Presence.UNKNOWN]})
    assert gone == [] and recorded == []


def test_probing_stops_once_the_iteration_settled() -> None:
    # A tier-1 exception: every rank reaches the iteration barrier; a pod lost later is not this fault's.
    gone, recorded = _loop(
        {"10.0.0.2:7000": [Presence.THERE, Presence.GONE], "10.0.0.3:7000": [Presence.THERE]}, settled_after=2
    )
    assert gone == [] and recorded == []


# ------------------------------------------------------------------ the record, in NVRx's barriers


def test_recorded_ranks_complete_nvrx_iteration_barrier_and_leave_them_terminated() -> None:
    _, endpoint = _master()
    kwargs = {"endpoint": endpoint, "namespace": "trainer/inprocess/t/0", "timeout": timedelta(seconds=10)}
    base = LauncherWrapperStore(**kwargs)  # type: ignore[arg-type]
    store = PrefixStore(3, base)
    arrived: list[float] = []

    def survivor(rank: int) -> None:  # what the Wrapper does after a fault: wait for every rank
        own = PrefixStore(3, LauncherWrapperStore(**kwargs))  # type: ignore[arg-type]
        own.iteration_barrier(ranks=[rank], rendezvous_count=4, timeout=timedelta(seconds=8))
        arrived.append(time.monotonic())

    threads = [threading.Thread(target=survivor, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    time.sleep(0.3)
    assert not arrived and not store.check([ITERATION_SETTLED_KEY])
    recorded_at = time.monotonic()
    record_lost_ranks(store, base, [2, 3], world_size=4)
    for t in threads:
        t.join(timeout=5)
    assert len(arrived) == 2 and max(arrived) - recorded_at < 1.0
    assert store.check([ITERATION_SETTLED_KEY])
    assert store.get_terminated_ranks() == {2, 3}
    assert base.get("inprocess_barrier_prefix:reentrant_barrier:termination_barrier:arrived") == b"2,3,"


def test_the_watch_runs_on_local_rank_0_under_the_launcher_only() -> None:
    timeouts = Timeouts(inprocess_liveness_timeout=15.0, inprocess_hard_timeout=30.0, **_nested())
    env = {**_env(0, 1, 3, 0, 2), LIVENESS_STORE_ENV: "127.0.0.1:4000"}
    watch = LostPodWatch.from_env(timeouts, {}, env)
    assert watch is not None and watch.deadline_s == 16.0  # the liveness timeout and one heartbeat
    assert LostPodWatch.from_env(timeouts, {}, {**_env(0, 1, 3, 1, 2), LIVENESS_STORE_ENV: "h:1"}) is None
    assert LostPodWatch.from_env(timeouts, {}, _env(0, 1, 3, 0, 2)) is None
    assert LostPodWatch.from_env(timeouts, {}, {**_env(0, 0, 1, 0, 2), LIVENESS_STORE_ENV: "h:1"}) is None


def _nested() -> dict[str, float]:
    return {
        "collective_timeout": 5.0,
        "inprocess_soft_timeout": 20.0,
        "inprocess_barrier_timeout": 40.0,
        "heartbeat_timeout": 60.0,
    }
