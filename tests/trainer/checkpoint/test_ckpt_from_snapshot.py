"""Durable saves written from the snapshot of their step (trainer/checkpoint/from_snapshot.py), one rank.

Each test fails on the code before it: there a save copied the live state again and planned the DCP save
in the loop thread, and the first save of a process waited for NVRx's worker to start, so a save blocked
the loop for the plan, the schedule and the worker's start-up, not for the snapshot it could reuse.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.trainer._ckpt import Events, make_state, snapshot, train_step
from trainer.checkpoint import CheckpointConfig, CheckpointManager, layout
from trainer.checkpoint.backends import NvrxBackend, TorchAsyncBackend
from trainer.checkpoint.loop import CheckpointLoop
from trainer.snapshot.config import SnapshotConfig
from trainer.snapshot.manager import Snapshots

MODES = ["nvrx", pytest.param("torch-async", marks=pytest.mark.soak)]


def _manager(tmp_path: Path, mode: str, *, worker_started: bool = True) -> CheckpointManager:
    """A one-rank manager; with nvrx, by default once its worker is up (saves then go through NVRx's
    worker, not the fallback that writes while the worker starts)."""
    cfg = CheckpointConfig(dir=tmp_path / "ckpt", interval_steps=1, keep_latest=2, mode=mode)
    mgr = CheckpointManager(cfg, rank=0, world_size=1)
    if mode == "nvrx" and worker_started and NvrxBackend._prewarm is not None:
        NvrxBackend._prewarm.join(60)
    return mgr


def _writers(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The backends' write_staged calls, in order: "nvrx" or "fallback"."""
    calls: list[str] = []
    for name, cls in (("nvrx", NvrxBackend), ("fallback", TorchAsyncBackend)):

        def counted(
            self: Any, *args: Any, _name: str = name, _write: Any = cls.write_staged, **kw: Any
        ) -> Any:
            calls.append(_name)
            return _write(self, *args, **kw)

        monkeypatch.setattr(cls, "write_staged", counted)
    return calls


def _snapshots(tmp_path: Path) -> Snapshots:
    cfg = SnapshotConfig(interval_steps=1, dir=tmp_path / "shm", replication=False)
    return Snapshots(cfg, rank=0, world_size=1, fingerprint="test")


def _assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def _restore(tmp_path: Path, one_rank: Any, mode: str) -> tuple[Any, dict[str, Any]]:
    fresh = make_state(one_rank, seed=1)
    mgr = _manager(tmp_path, mode)
    try:
        return mgr.restore(fresh), fresh
    finally:
        mgr.close()


@pytest.mark.parametrize("mode", MODES)
def test_a_save_from_the_snapshot_holds_that_step_exactly_though_training_goes_on(
    tmp_path: Path, one_rank: Any, mode: str
) -> None:
    state, snaps, mgr = make_state(one_rank), _snapshots(tmp_path), _manager(tmp_path, mode)
    try:
        for step in range(3):
            train_step(state, step)
            snap = snaps.after_step(step, state)
            assert snap is not None and snap.reusable is not None and snap.reusable.step == step
            if step == 2:
                expected, expected_rng = snapshot(state), torch.get_rng_state()
            mgr.save(step, state, snap.reusable)
            train_step(state, 100 + step)  # the live state moves on while the thread copies the slot
            mgr.wait()
        assert mgr.committed_step == 2
    finally:
        mgr.close()
        snaps.close()
    restored, fresh = _restore(tmp_path, one_rank, mode)
    assert (restored.step, restored.skipped) == (2, [])
    assert fresh["trainer"].step == 2 and torch.equal(torch.get_rng_state(), expected_rng)
    _assert_same(snapshot(fresh), expected)
    manifest = json.loads((tmp_path / "ckpt" / "step_00000002" / layout.MANIFEST).read_text())
    assert manifest["mode"] == mode and ".metadata" in manifest["files"]  # signed and committed as ever


def test_the_tensor_placements_are_read_from_the_snapshots_plan_once_per_plan(
    tmp_path: Path, one_rank: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The metas the writer needs come from the snapshot's kept plan: the same as a walk over the save
    dict, computed once while the plan is kept (the walk took as long as a snapshot in the demo)."""
    from trainer.checkpoint import from_snapshot

    state, snaps = make_state(one_rank), _snapshots(tmp_path)
    reads: list[int] = []
    real = from_snapshot.plan_metas
    monkeypatch.setattr(from_snapshot, "plan_metas", lambda plan: reads.append(1) or real(plan))
    cache = from_snapshot.MetasCache()
    try:
        for step in range(3):
            train_step(state, step)
            snap = snaps.after_step(step, state)
            assert snap is not None and snap.reusable is not None and snap.reusable.plan is not None
            metas = cache.of(snap.reusable)
            assert metas == from_snapshot.tensor_metas(snap.reusable.save_dict)
            assert any(m.spec is not None for m in metas)  # the DTensors' placements are there
        assert snaps.plan.builds == 1 and len(reads) == 1  # one plan, read once
    finally:
        snaps.close()


def test_a_committed_save_lets_go_of_its_writer_where_it_commits(tmp_path: Path, one_rank: Any) -> None:
    """NVRx's writer holds the write buckets of the whole state: dropped when the save commits (the
    commit thread in a training run), not by the next save in the loop (0.3 s for a 1 GiB shard)."""
    state, snaps, mgr = make_state(one_rank), _snapshots(tmp_path), _manager(tmp_path, "nvrx")
    try:
        train_step(state, 0)
        snap = snaps.after_step(0, state)
        assert snap is not None
        mgr.save(0, state, snap.reusable)
        write = mgr.saver._from_snapshot._current  # type: ignore[union-attr]
        mgr.wait()
        assert mgr.committed_step == 0 and write is not None and write.inner is None
    finally:
        mgr.close()
        snaps.close()


def test_a_save_from_the_snapshot_blocks_no_longer_than_the_snapshot_though_planning_is_slow(
    tmp_path: Path, one_rank: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plan and the hand-over to the worker (here 1 s) run in the background thread, not the loop."""
    slow = NvrxBackend.write_staged

    def write_staged(self: Any, *args: Any, **kwargs: Any) -> Any:
        time.sleep(1.0)
        return slow(self, *args, **kwargs)

    monkeypatch.setattr(NvrxBackend, "write_staged", write_staged)
    state, snaps, mgr = make_state(one_rank), _snapshots(tmp_path), _manager(tmp_path, "nvrx")
    try:
        for step in range(3):
            train_step(state, step)
            snap = snaps.after_step(step, state)
            assert snap is not None
            t0 = time.perf_counter()
            result = mgr.save(step, state, snap.reusable)
            loop_blocked = time.perf_counter() - t0
            # bounded by the snapshot's own blocked time plus scheduling noise of a shared machine (0.19 s
            # seen beside another test worker on 2 cores), far below the 1 s plan
            assert result.blocked_s <= snap.blocked_s + 0.3, (result.blocked_s, snap.blocked_s)
            assert loop_blocked < 0.5
            mgr.wait()
            assert mgr.committed_step == step
    finally:
        mgr.close()
        snaps.close()


def test_the_runs_last_save_is_written_in_this_process_the_others_by_the_worker(
    tmp_path: Path, one_rank: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loop waits for the last step's save at once (CheckpointLoop.finish), and NVRx's worker runs at
    nice 10 to yield to training: that save is written by this process (the fallback's dcp.save), every
    earlier one by the worker. The last checkpoint is committed and restores that step exactly."""
    state, snaps, mgr = make_state(one_rank), _snapshots(tmp_path), _manager(tmp_path, "nvrx")
    writers = _writers(monkeypatch)
    loop = CheckpointLoop(mgr, mgr.cfg, Events(), rank=0, last_step=2)
    try:
        for step in range(3):
            train_step(state, step)
            snap = snaps.after_step(step, state)
            assert snap is not None
            loop.after_step(step, state, snap.reusable)
        expected = snapshot(state)
        loop.finish(state)
        assert mgr.committed_step == 2
        assert writers == ["nvrx", "nvrx", "fallback"]
    finally:
        loop.close()
        snaps.close()
    restored, fresh = _restore(tmp_path, one_rank, "nvrx")
    assert restored.step == 2
    _assert_same(snapshot(fresh), expected)


def test_a_slow_writer_start_up_is_never_waited_for(
    tmp_path: Path, one_rank: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NVRx's worker is started when the manager is built (long before the first due save). A start-up
    still under way when a save comes (20-40 s in the demo on 2 loaded cores) is waited for neither by
    the loop nor by the save: the fallback writes it (dcp.save in the background thread), and the next
    save, due before the worker would have been up, does not wait for it either. Once the worker is up,
    saves go through it again."""
    state, snaps = make_state(one_rank), _snapshots(tmp_path)
    mgr = _manager(tmp_path, "nvrx", worker_started=False)
    assert NvrxBackend._prewarm is not None  # started with the manager, before any save
    NvrxBackend._prewarm.join(60)
    starting = threading.Thread(target=time.sleep, args=(30.0,), name="slow-worker-start", daemon=True)
    starting.start()
    monkeypatch.setattr(NvrxBackend, "_prewarm", starting)  # as a cold worker on a loaded host
    writers = _writers(monkeypatch)
    try:
        for step in range(3):
            if step == 2:
                monkeypatch.setattr(NvrxBackend, "_prewarm", None)  # the worker is up
            train_step(state, step)
            snap = snaps.after_step(step, state)
            assert snap is not None
            expected = snapshot(state)
            result = mgr.save(step, state, snap.reusable)
            assert result.blocked_s < 0.5
            mgr.wait()
            assert mgr.committed_step == step
            assert step == 2 or starting.is_alive(), "a save waited for the worker's start-up"
        assert writers == ["fallback", "fallback", "nvrx"]
    finally:
        mgr.close()
        snaps.close()
    restored, fresh = _restore(tmp_path, one_rank, "nvrx")
    assert restored.step == 2
    _assert_same(snapshot(fresh), expected)
    # the fallback's checkpoints are the same DCP checkpoints, committed and signed as ever
    restored_1 = tmp_path / "ckpt" / "step_00000001" / layout.MANIFEST
    assert ".metadata" in json.loads(restored_1.read_text())["files"]


def test_a_crash_during_the_background_write_leaves_the_previous_checkpoint_and_resume_exact(
    tmp_path: Path, one_rank: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    state, snaps, mgr = make_state(one_rank), _snapshots(tmp_path), _manager(tmp_path, "nvrx")
    started, never = threading.Event(), threading.Event()
    real = NvrxBackend.write_staged
    try:
        train_step(state, 0)
        snap = snaps.after_step(0, state)
        assert snap is not None
        expected, expected_rng = snapshot(state), torch.get_rng_state()
        mgr.save(0, state, snap.reusable)
        mgr.wait()
        assert mgr.committed_step == 0

        def stuck(self: Any, *args: Any, **kwargs: Any) -> Any:
            started.set()
            never.wait(30)  # the process dies in the middle of the write
            return real(self, *args, **kwargs)

        monkeypatch.setattr(NvrxBackend, "write_staged", stuck)
        train_step(state, 1)
        snap = snaps.after_step(1, state)
        assert snap is not None
        mgr.save(1, state, snap.reusable)
        assert started.wait(30)
        assert mgr.maybe_finalize() == []  # not done: nothing committed
    finally:
        mgr.close()  # what a crash leaves: the save abandoned in the middle (its temp dir is never loaded)
        never.set()
        snaps.close()
    root = tmp_path / "ckpt"
    assert sorted(p.name for p in root.iterdir() if p.name.startswith("step_")) == ["step_00000000"]
    restored, fresh = _restore(tmp_path, one_rank, "nvrx")
    assert restored.step == 0 and fresh["trainer"].step == 0
    assert torch.equal(torch.get_rng_state(), expected_rng)
    _assert_same(snapshot(fresh), expected)


def test_a_snapshot_held_by_a_save_is_not_overwritten_until_released(tmp_path: Path, one_rank: Any) -> None:
    """The next-but-one snapshot goes to the held slot: it waits for the release (and counts the wait)."""
    state, snaps = make_state(one_rank), _snapshots(tmp_path)
    try:
        train_step(state, 0)
        first = snaps.after_step(0, state)
        assert first is not None and first.reusable is not None
        hold = first.reusable.hold()
        train_step(state, 1)
        assert snaps.after_step(1, state) is not None  # the other slot: no wait
        train_step(state, 2)
        threading.Timer(0.5, hold.release).start()  # after the step: the wait alone is measured
        third = snaps.after_step(2, state)
        assert third is not None and third.wait_s >= 0.4 and third.reusable.slot == first.reusable.slot
    finally:
        snaps.close()


class _Interrupted(Exception):
    """What the in-process Wrapper raises in the loop thread (RankShouldRestart), here a stand-in."""


def test_a_snapshot_waiting_for_a_held_slot_is_interrupted_by_an_asynchronous_exception(
    tmp_path: Path, one_rank: Any
) -> None:
    """A rank whose snapshot waits for a slot that a stuck save still holds (its reader in a collective
    with a faulted rank) leaves as soon as the Wrapper interrupts it, not when the hold ends: the
    Wrapper's exception arrives asynchronously, and Python delivers it only between two waits."""
    import ctypes

    state, snaps = make_state(one_rank), _snapshots(tmp_path)
    try:
        train_step(state, 0)
        first = snaps.after_step(0, state)
        assert first is not None and first.reusable is not None
        hold = first.reusable.hold()  # never released before the interruption
        train_step(state, 1)
        snaps.after_step(1, state)
        train_step(state, 2)
        loop = threading.get_ident()

        def interrupt() -> None:
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(loop), ctypes.py_object(_Interrupted))

        threading.Timer(0.3, interrupt).start()
        started = time.monotonic()
        with pytest.raises(_Interrupted):
            snaps.after_step(2, state)  # waits for the held slot
            time.sleep(5)  # not reached when the wait is interruptible
        assert time.monotonic() - started < 2.0
        hold.release()
    finally:
        snaps.close()


def test_the_worker_counts_as_up_only_once_it_has_run_its_warm_up_request(
    tmp_path: Path, one_rank: Any
) -> None:
    """NVRx hands a request over before the spawned worker has imported torch: a save taken as soon as
    the warm-up thread returned was queued behind the rest of the start-up (seconds; 15-20 s loaded)."""
    from trainer.checkpoint import nvrx_async

    mgr = _manager(tmp_path, "nvrx", worker_started=False)
    try:
        backend = mgr.saver._backend
        assert NvrxBackend._prewarm is not None
        NvrxBackend._prewarm.join(60)
        assert backend.worker_ready()
        assert nvrx_async.worker_process(NvrxBackend._queue) is not None
        assert nvrx_async.poll_pending(NvrxBackend._queue) == 0, "the warm-up request is still queued"
    finally:
        mgr.close()
