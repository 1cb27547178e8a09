"""The launcher's node beat (trainer/launcher/beat.py) on a real TCPStore: it beats only while its node is
active in a round, survives a store that is gone, and finds the store from ft_launcher's own flag. (What
the workers make of the beats: tests/trainer/resilience/test_liveness.py.)"""

from __future__ import annotations

import time
from datetime import timedelta

import torch.distributed as dist

from trainer.launcher.beat import LauncherBeat, rdzv_endpoint
from trainer.resilience.liveness import liveness_key
from trainer.runtime.ports import free_port


def _master() -> tuple[dist.TCPStore, str]:
    port = free_port(span=1)
    store = dist.TCPStore(
        "127.0.0.1", port, is_master=True, timeout=timedelta(seconds=5), wait_for_workers=False
    )
    return store, f"127.0.0.1:{port}"


def test_the_endpoint_is_taken_from_either_spelling_of_the_launcher_flag() -> None:
    assert (
        rdzv_endpoint(["--nnodes=2", "--rdzv-endpoint=pod-0.svc:29500", "-m", "trainer"]) == "pod-0.svc:29500"
    )
    assert rdzv_endpoint(["--rdzv_endpoint", "10.0.0.1:1234"]) == "10.0.0.1:1234"
    assert rdzv_endpoint(["--nnodes=2", "-m", "trainer"]) is None


def test_the_launcher_beats_only_while_its_node_is_active() -> None:
    master, endpoint = _master()
    beat = LauncherBeat(endpoint, interval_s=0.05)
    try:
        beat.serve(cycle=3, group_rank=1)
        key = liveness_key(3, 1)
        # Sent before serve returns, so before the workers start (a TCPStore set is not acknowledged:
        # another connection may see it a moment later).
        master.wait([key], timedelta(seconds=2))
        first = master.get(key)
        time.sleep(0.3)
        assert master.get(key) != first, "the beat did not change"
        beat.pause()  # the node entered the next rendezvous
        time.sleep(0.5)  # a beat already past the pause check may still land (its I/O is outside the lock)
        paused = master.get(key)
        time.sleep(0.3)
        assert master.get(key) == paused, "a paused launcher still beats for its old round"
        beat.serve(cycle=4, group_rank=0)
        master.wait([liveness_key(4, 0)], timedelta(seconds=2))
    finally:
        beat.stop()


def test_a_launcher_whose_store_is_gone_keeps_trying_without_raising() -> None:
    calls: list[str] = []

    def unreachable(endpoint: str) -> None:
        calls.append(endpoint)
        raise RuntimeError("connection refused")

    beat = LauncherBeat("127.0.0.1:1", interval_s=0.02, store_factory=unreachable)
    beat.serve(cycle=0, group_rank=0)
    time.sleep(0.2)
    beat.stop()
    assert len(calls) >= 3


def test_a_launcher_waiting_in_a_rendezvous_is_seen_as_a_standing_spare() -> None:
    """A paused launcher (a hot spare waiting in the rendezvous) beats under its standby slot, which
    `spare_standing_by` sees change; once a round makes it active, or it is gone, it is no spare."""
    from trainer.resilience.liveness import spare_standing_by

    master, endpoint = _master()
    assert not spare_standing_by(master, wait_s=0.3)  # nobody ever stood by
    beat = LauncherBeat(endpoint, interval_s=0.05)
    try:
        beat.pause()  # in the rendezvous, as a spare is for the whole run
        master.wait(["trainer/standby/1"], timedelta(seconds=2))
        assert spare_standing_by(master, wait_s=0.3)
        beat.serve(cycle=2, group_rank=1)  # admitted: now it trains
        time.sleep(0.3)  # a beat already past the check may still land (its I/O is outside the lock)
        assert not spare_standing_by(master, wait_s=0.3)
    finally:
        beat.stop()
    assert not spare_standing_by(master, wait_s=0.3)
