"""Checkpointing on one rank (in this process): round trip per mode, retention, atomic layout, corrupt
checkpoints skipped with a reason, failing or dead background writers surfacing as CheckpointWriteError."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.trainer._ckpt import make_state, snapshot, train_step
from trainer.checkpoint import (
    CheckpointConfig,
    CheckpointHooks,
    CheckpointManager,
    CheckpointWriteError,
    layout,
)

# nvrx, the chart's mode, in make test; the others in make soak (test_ckpt_modes.py resumes a real run
# from each of them in make test).
MODES = [
    pytest.param("sync", marks=pytest.mark.soak),
    pytest.param("torch-async", marks=pytest.mark.soak),
    "nvrx",
]


def _assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def _manager(tmp_path: Path, mode: str, **kw: Any) -> CheckpointManager:
    fields: dict[str, Any] = {"interval_steps": 1, "keep_latest": 2, "mode": mode} | kw
    return CheckpointManager(CheckpointConfig(dir=tmp_path / "ckpt", **fields), rank=0, world_size=1)


def _committed(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.name.startswith("step_"))


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"interval_steps": 0}, "ckpt_interval"),
        ({"keep_latest": 0}, "ckpt_keep"),
        ({"mode": "fast"}, "ckpt_mode"),
        ({"write_timeout_s": 0}, "ckpt_write_timeout"),
        ({"local_dir": "ckpt"}, "ckpt_local_dir"),
    ],
)
def test_bad_config_names_the_option(kwargs: dict[str, Any], field: str) -> None:
    """Constructed in code or from flags, a bad field is named by the option a user writes."""
    with pytest.raises(ValueError, match=rf"^config error: {field}:"):
        CheckpointConfig(dir=Path("ckpt"), **kwargs)


@pytest.mark.parametrize("mode", MODES)
def test_round_trip_and_retention(tmp_path: Path, one_rank: Any, mode: str) -> None:
    state = make_state(one_rank)
    mgr = _manager(tmp_path, mode)
    try:
        assert [s for s in range(6) if mgr.should_save(s)] == list(range(6))
        for step in range(4):
            train_step(state, step)
            result = mgr.save(step, state)
            assert result.blocked_s > 0 and result.bytes > 0
            if step == 2:
                expected = snapshot(state)
                expected_rng = torch.get_rng_state()
            mgr.maybe_finalize()
        mgr.wait()
        assert mgr.maybe_finalize() == []  # nothing left
        assert mgr.latest_committed_path() == tmp_path / "ckpt" / "step_00000003"
    finally:
        mgr.close()
    root = tmp_path / "ckpt"
    assert _committed(root) == ["step_00000002", "step_00000003"]  # keep_latest=2
    assert not [p for p in root.iterdir() if p.name.startswith((".tmp", ".trash"))]
    manifest = json.loads((root / "step_00000003" / layout.MANIFEST).read_text())
    assert manifest["step"] == 3 and ".metadata" in manifest["files"] and manifest["mode"] == mode
    assert set(manifest["files"]) == {p.name for p in (root / "step_00000003").iterdir()} - {layout.MANIFEST}

    # Restore step 2 (the newest is removed) into fresh objects with a different init.
    layout.discard(root / "step_00000003")
    fresh = make_state(one_rank, seed=1)
    torch.manual_seed(123)
    mgr = _manager(tmp_path, mode)
    try:
        restored = mgr.load_latest(fresh)
    finally:
        mgr.close()
    assert (restored.step, restored.skipped) == (2, [])
    assert restored.path == str(root / "step_00000002")
    assert fresh["trainer"].step == 2
    assert torch.equal(torch.get_rng_state(), expected_rng)
    _assert_same(snapshot(fresh), expected)


def test_nothing_to_restore(tmp_path: Path, one_rank: Any) -> None:
    mgr = _manager(tmp_path, "sync")
    try:
        restored = mgr.load_latest(make_state(one_rank))
    finally:
        mgr.close()
    assert (restored.step, restored.path, restored.skipped) == (-1, None, [])


def _flip_bytes(path: Path) -> None:
    with open(path, "r+b") as fh:
        fh.seek(path.stat().st_size // 2)
        chunk = fh.read(16)
        fh.seek(path.stat().st_size // 2)
        fh.write(bytes(b ^ 0xFF for b in chunk))


def test_damaged_checkpoints_are_skipped_with_reasons(tmp_path: Path, one_rank: Any) -> None:
    state = make_state(one_rank)
    mgr = _manager(tmp_path, "sync", keep_latest=5)
    for step in range(4):
        train_step(state, step)
        mgr.save(step, state)
        if step == 0:
            expected = snapshot(state)
    mgr.close()
    root = tmp_path / "ckpt"
    shard = max((root / "step_00000003").glob("*.distcp"), key=lambda p: p.stat().st_size)
    _flip_bytes(shard)  # same size, different bytes: only the checksum sees it
    with open(max((root / "step_00000002").glob("*.distcp")), "r+b") as fh:
        fh.truncate(100)
    (root / "step_00000001" / layout.MANIFEST).unlink()
    (root / layout.temp_name(7)).mkdir()  # an interrupted save

    fresh = make_state(one_rank, seed=1)
    mgr = _manager(tmp_path, "sync")
    try:
        restored = mgr.load_latest(fresh)
    finally:
        mgr.close()
    assert restored.step == 0
    reasons = {Path(s.path).name: s.reason for s in restored.skipped}
    assert "checksum mismatch" in reasons["step_00000003"]
    assert "size mismatch" in reasons["step_00000002"]
    assert "no manifest" in reasons["step_00000001"]
    assert "never committed" in reasons[layout.temp_name(7)]
    assert not (root / layout.temp_name(7)).exists()  # garbage removed
    _assert_same(snapshot(fresh), expected)


def test_before_commit_hook_sees_durable_shards_and_no_visible_checkpoint(
    tmp_path: Path, one_rank: Any
) -> None:
    seen: list[tuple[int, list[str], list[str]]] = []
    root = tmp_path / "ckpt"

    def hook(step: int) -> None:
        tmp = root / layout.temp_name(step)
        seen.append((step, sorted(p.name for p in tmp.iterdir()), _committed(root)))

    state = make_state(one_rank)
    cfg = CheckpointConfig(dir=root, interval_steps=1, keep_latest=3, mode="nvrx")
    mgr = CheckpointManager(cfg, rank=0, world_size=1, hooks=CheckpointHooks(before_commit=hook))
    try:
        for step in range(2):
            train_step(state, step)
            mgr.save(step, state)
        mgr.wait()
    finally:
        mgr.close()
    assert [s[0] for s in seen] == [0, 1]
    assert "__0_0.distcp" in seen[1][1] and seen[1][2] == ["step_00000000"]  # step 1 not visible yet
    assert _committed(root) == ["step_00000000", "step_00000001"]


@pytest.mark.parametrize("mode", ["sync", "torch-async"])
def test_failing_writer_raises_and_leaves_nothing_visible(
    tmp_path: Path, one_rank: Any, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from torch.distributed.checkpoint import FileSystemWriter

    state = make_state(one_rank)
    mgr = _manager(tmp_path, mode)
    try:
        train_step(state, 0)
        mgr.save(0, state)
        mgr.wait()

        def disk_full(self: Any, plan: Any, planner: Any) -> Any:
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(FileSystemWriter, "write_data", disk_full)
        train_step(state, 1)
        with pytest.raises(CheckpointWriteError, match="No space left"):
            mgr.save(1, state)
            mgr.wait()
        monkeypatch.undo()
        assert _committed(tmp_path / "ckpt") == ["step_00000000"]
        assert not (tmp_path / "ckpt" / layout.temp_name(1)).exists()
        train_step(state, 2)  # the manager is usable again
        mgr.save(2, state)
        mgr.wait()
    finally:
        mgr.close()
    assert _committed(tmp_path / "ckpt") == ["step_00000000", "step_00000002"]


def test_hanging_writer_times_out(tmp_path: Path, one_rank: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from torch.distributed.checkpoint import FileSystemWriter

    release = threading.Event()
    real_write = FileSystemWriter.write_data

    def stuck(self: Any, plan: Any, planner: Any) -> Any:
        release.wait(60)  # the background thread hangs until the test lets it go
        return real_write(self, plan, planner)

    monkeypatch.setattr(FileSystemWriter, "write_data", stuck)
    state = make_state(one_rank)
    mgr = _manager(tmp_path, "torch-async", write_timeout_s=1.0)
    try:
        train_step(state, 0)
        mgr.save(0, state)
        t0 = time.monotonic()
        with pytest.raises(CheckpointWriteError, match=r"not finished after 1\.0 s"):
            mgr.wait()
        assert time.monotonic() - t0 < 10
    finally:
        release.set()
        mgr.close()
    assert _committed(tmp_path / "ckpt") == []


def test_dead_nvrx_worker_raises_instead_of_hanging(tmp_path: Path, one_rank: Any) -> None:
    from trainer.checkpoint import nvrx_async

    state = make_state(one_rank)
    mgr = _manager(tmp_path, "nvrx", write_timeout_s=60.0)
    try:
        train_step(state, 0)
        mgr.save(0, state)
        mgr.wait()
        worker = nvrx_async.worker_process(mgr.saver._backend._queue_in_use)
        worker.kill()  # e.g. the OOM killer; NVRx itself would now wait forever
        worker.join(10)
        train_step(state, 1)
        t0 = time.monotonic()
        with pytest.raises(CheckpointWriteError, match="worker died"):
            mgr.save(1, state)
            mgr.wait()
        assert time.monotonic() - t0 < 30
    finally:
        mgr.close()
    assert _committed(tmp_path / "ckpt") == ["step_00000000"]
    # A new manager (as after an in-process restart) gets a fresh worker and saves again.
    mgr = _manager(tmp_path, "nvrx")
    try:
        train_step(state, 2)
        mgr.save(2, state)
        mgr.wait()
    finally:
        mgr.close()
    assert _committed(tmp_path / "ckpt") == ["step_00000000", "step_00000002"]


def test_compat_preload_rebinding_only_without_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    import functools

    from trainer.checkpoint import nvrx_async

    def preload(buckets: Any, non_blocking: bool) -> Any:
        return (buckets, non_blocking)

    fn = functools.partial(preload, ["b"], True)
    monkeypatch.setattr(nvrx_async, "cuda_available", lambda: False)
    assert nvrx_async.cpu_safe_preload(fn)() == (["b"], False)  # 0.4.1 would call torch.cuda.synchronize()
    assert nvrx_async.cpu_safe_preload(None) is None
    monkeypatch.setattr(nvrx_async, "cuda_available", lambda: True)
    assert nvrx_async.cpu_safe_preload(fn) is fn  # a pass-through where CUDA exists
