"""The node-local checkpoint tier (trainer/checkpoint/local_tier.py, drain.py, local_restore.py).

A save is written and sealed in the local directory first and drained to the shared one, which commits
only after the drain; a crash during the drain leaves the shared directory's previous checkpoint whole;
retention covers both tiers; a restore takes the local copy when it is newer than the shared one and
every rank has it, and falls back to the shared checkpoint when one rank lacks it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import zlib
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp
from torch.distributed.device_mesh import init_device_mesh

from tests.trainer._ckpt import Events, make_state, snapshot, train_step
from tests.trainer._dist import run_ranks
from trainer.checkpoint import (
    CheckpointConfig,
    CheckpointLoop,
    CheckpointManager,
    CheckpointWriteError,
    layout,
)
from trainer.checkpoint import local_tier as local_tier_module
from trainer.recovery.restore import restore
from trainer.state.save_dict import fingerprint


def crc32_file(path: Path) -> str:
    """An independent CRC32 of a file's bytes, 8 hex digits, as the manifests record it."""
    return f"{zlib.crc32(path.read_bytes()):08x}"


def _cfg(root: Path, mode: str = "torch-async", local: Path | None = None, **kw: Any) -> CheckpointConfig:
    fields: dict[str, Any] = {"interval_steps": 1, "keep_latest": 2, "mode": mode} | kw
    return CheckpointConfig(dir=root / "ckpt", local_dir=local or root / "local", **fields)


def _steps(root: Path) -> list[int]:
    if not root.is_dir():
        return []
    return sorted(int(p.name[5:]) for p in root.iterdir() if p.name.startswith("step_"))


def _assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def _restore(mgr: CheckpointManager, cfg: CheckpointConfig, state: dict[str, Any], rank: int) -> Any:
    loop = CheckpointLoop(mgr, cfg, Events(), rank=rank, last_step=100)
    got = restore(None, loop, state, rank=rank, device=torch.device("cpu"), events=loop.events)
    return got, [e for e in loop.events.seen if e["ev"] == "restore"]


def test_the_shared_commit_comes_only_after_the_drain(tmp_path: Path, one_rank: Any) -> None:
    state = make_state(one_rank)
    cfg = _cfg(tmp_path)
    mgr = CheckpointManager(cfg, rank=0, world_size=1)
    assert mgr.local is not None
    gate, draining = threading.Event(), threading.Event()
    real_drain = mgr.local.drain

    def gated_drain(*args: Any) -> Any:
        draining.set()
        assert gate.wait(60), "the test never opened the gate"
        return real_drain(*args)

    mgr.local.drain = gated_drain  # type: ignore[method-assign]
    try:
        train_step(state, 0)
        mgr.save(0, state)
        calls = 0
        while not draining.is_set() and calls < 2000:  # polls at calls 1, 2, 4, ...: seals, then drains
            mgr.maybe_finalize()
            calls += 1
            draining.wait(0.01)
        assert draining.is_set(), "the save was never sealed locally"
        # Sealed locally, drain in flight: the shared directory holds only the temp directory.
        seal = json.loads((tmp_path / "local" / "step_00000000" / "rank0.json").read_text())
        assert seal["step"] == 0 and seal[layout.FINGERPRINT] == fingerprint(state)
        assert _steps(tmp_path / "ckpt") == [] and (tmp_path / "ckpt" / ".tmp-step_00000000").is_dir()
        for _ in range(20):
            assert mgr.maybe_finalize() == []  # no commit while the drain is held
        assert _steps(tmp_path / "ckpt") == []
        gate.set()
        assert mgr.wait() == [0]
    finally:
        gate.set()
        mgr.close()
    manifest = json.loads((tmp_path / "ckpt" / "step_00000000" / layout.MANIFEST).read_text())
    local_dir = tmp_path / "local" / "step_00000000"
    for name, entry in manifest["files"].items():  # the shared copy is the sealed local one, byte for byte
        assert crc32_file(local_dir / name) == entry["crc32"], name
    assert set(seal["files"]) | {".metadata"} == set(manifest["files"])


@pytest.mark.parametrize(
    "mode", ["nvrx", *(pytest.param(m, marks=pytest.mark.soak) for m in ("sync", "torch-async"))]
)
def test_crash_during_drain_keeps_the_shared_checkpoint_and_restores_the_newer_local_one(
    tmp_path: Path, one_rank: Any, mode: str
) -> None:
    state = make_state(one_rank)
    cfg = _cfg(tmp_path, mode)
    mgr = CheckpointManager(cfg, rank=0, world_size=1)
    assert mgr.local is not None
    try:
        train_step(state, 0)
        mgr.save(0, state)
        mgr.wait()  # sync mode commits in save()
        assert mgr.committed_step == 0
        before = {p.name: p.read_bytes() for p in (tmp_path / "ckpt" / "step_00000000").iterdir()}
        train_step(state, 1)
        expected = snapshot(state)
        mgr.local.crash_after_bytes = 1000  # the drain of step 1 fails part-way through its first file
        with pytest.raises(CheckpointWriteError, match="injected crash in the drain"):
            mgr.save(1, state)
            mgr.wait()
    finally:
        mgr.close()
    assert _steps(tmp_path / "ckpt") == [0]
    after = {p.name: p.read_bytes() for p in (tmp_path / "ckpt" / "step_00000000").iterdir()}
    assert after == before, "the shared checkpoint of step 0 changed"
    assert _steps(tmp_path / "local") == [0, 1]
    assert (tmp_path / "local" / "step_00000001" / "rank0.json").is_file()

    fresh = make_state(one_rank, seed=5)
    mgr = CheckpointManager(cfg, rank=0, world_size=1)
    try:
        got, events = _restore(mgr, cfg, fresh, rank=0)
    finally:
        mgr.close()
    assert (got.step, got.source) == (1, "local")
    assert [(e["step"], e["source"]) for e in events] == [(1, "local")]
    assert fresh["trainer"].step == 1
    _assert_same(snapshot(fresh), expected)


def test_a_process_killed_during_the_drain_leaves_the_shared_checkpoint_whole(tmp_path: Path) -> None:
    with pytest.raises(mp.ProcessExitedException, match="SIGKILL"):
        run_ranks(_killed_in_drain, 1, str(tmp_path), timeout_s=180)
    assert _steps(tmp_path / "ckpt") == [0]
    manifest = json.loads((tmp_path / "ckpt" / "step_00000000" / layout.MANIFEST).read_text())
    for name, entry in manifest["files"].items():
        assert crc32_file(tmp_path / "ckpt" / "step_00000000" / name) == entry["crc32"], name
    assert (tmp_path / "ckpt" / ".tmp-step_00000001").is_dir(), "the kill did not land in the drain"
    assert (tmp_path / "local" / "step_00000001" / "rank0.json").is_file()


def _killed_in_drain(rank: int, world_size: int, root: str) -> None:
    mesh = init_device_mesh("cpu", (world_size,))
    state = make_state(mesh)
    mgr = CheckpointManager(_cfg(Path(root), "sync"), rank=rank, world_size=world_size)
    train_step(state, 0)
    mgr.save(0, state)
    real_copy = local_tier_module._copy

    def copy_then_die(src: Path, dst: Path, cancel: Any, budget: Any) -> str:
        crc = real_copy(src, dst, cancel, budget)
        os.kill(os.getpid(), signal.SIGKILL)  # after the first file of the drain: a node dies mid-drain
        return crc

    local_tier_module._copy = copy_then_die
    train_step(state, 1)
    mgr.save(1, state)  # sync: seals, drains (and dies there)
    os._exit(3)  # never reached


def test_retention_covers_both_tiers(tmp_path: Path, one_rank: Any) -> None:
    state = make_state(one_rank)
    cfg = _cfg(tmp_path, "sync")
    # Another run's sealed local step (another model, and not this directory's lineage: lease.py): never
    # restored, and pruned when the manager starts (the NVMe tier is tied to the run).
    foreign = tmp_path / "local" / "step_00000001"
    foreign.mkdir(parents=True)
    (foreign / "rank0.json").write_text(json.dumps({"format": 1, "step": 1, layout.FINGERPRINT: "other"}))
    # A crashed, never sealed write of this rank (older than what it will seal): a leftover to delete.
    leftover = tmp_path / "local" / "step_00000002"
    leftover.mkdir()
    (leftover / "__0_0.distcp").write_bytes(b"half a write")
    mgr = CheckpointManager(cfg, rank=0, world_size=1)
    try:
        for step in range(3, 8):
            train_step(state, step)
            mgr.save(step, state)
        assert mgr.wait() == []
        # A resumed run seals an older step again: it is kept (just sealed) with the newest other one.
        train_step(state, 4)
        mgr.save(4, state)
    finally:
        mgr.close()
    assert _steps(tmp_path / "ckpt") == [4, 7]
    assert _steps(tmp_path / "local") == [4, 7]
    assert not (foreign / "rank0.json").exists()
    assert not leftover.exists()


def test_restore_uses_the_local_copy_only_when_every_rank_has_it(tmp_path: Path) -> None:
    """Two ranks, one local directory each (two nodes): steps 0 and 1 sealed locally, step 1's drain cut
    short, so the shared directory holds step 0. Both ranks have step 1: both restore it from the local
    tier (each reading the values DCP stored in the other node's file from its own sealed copy). Rank
    1's copy of step 1 damaged: both restore step 0, still from the local tier. Rank 1 without a local
    copy (a replaced node): both restore step 0 from the shared checkpoint."""
    run_ranks(_two_ranks, 2, str(tmp_path), timeout_s=300)


def _two_ranks(rank: int, world_size: int, root: str) -> None:
    mesh = init_device_mesh("cpu", (world_size,))
    for case in ("all", "rank1-lacks", "rank1-damaged"):
        _case(rank, world_size, mesh, Path(root) / case, case)


def _case(rank: int, world_size: int, mesh: Any, root: Path, case: str) -> None:
    cfg = _cfg(root, "sync", local=root / f"node{rank}")
    state = make_state(mesh)
    mgr = CheckpointManager(cfg, rank=rank, world_size=world_size)
    assert mgr.local is not None
    expected = {}
    try:
        for step in (0, 1):
            train_step(state, step)
            expected[step] = snapshot(state)
            if step == 1:
                mgr.local.crash_after_bytes = 0
            try:
                mgr.save(step, state)
            except CheckpointWriteError:
                assert step == 1
    finally:
        mgr.close()
    seal = root / f"node{rank}" / "step_00000001" / f"rank{rank}.json"
    assert seal.is_file() and _steps(root / "ckpt") == [0]
    if rank == 1 and case == "rank1-lacks":
        shutil.rmtree(root / "node1")
    if rank == 1 and case == "rank1-damaged":
        shard = sorted((root / "node1" / "step_00000001").glob("__1_*"))[0]
        with open(shard, "r+b") as fh:
            fh.seek(10)
            fh.write(b"\xff\xfe\xfd")
    fresh = make_state(mesh, seed=9)
    mgr = CheckpointManager(cfg, rank=rank, world_size=world_size)
    try:
        got, events = _restore(mgr, cfg, fresh, rank)
    finally:
        mgr.close()
    want = {"all": (1, "local"), "rank1-damaged": (0, "local"), "rank1-lacks": (0, "fsx")}[case]
    assert (got.step, got.source) == want, (case, rank, got)
    assert [(e["step"], e["source"]) for e in events] == [want]
    assert fresh["trainer"].step == want[0]
    _assert_same(snapshot(fresh), expected[want[0]])
    if case == "rank1-damaged" and rank == 1:
        assert any("checksum mismatch" in r for r in got.refused), got.refused


def test_a_step_folder_another_rank_of_the_node_removes_meanwhile_is_no_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The ranks of a node share its local folder, and each removes its own part of an old step; the last
    # one out removes the step's folder. Rank 1 found the folder there, then rank 0 removed it before
    # rank 1 listed it (seen in a run: rank 1's retention raised, logged as its newest step "not sealed").
    tier = local_tier_module.LocalTier(tmp_path / "nvme", rank=1, world_size=2, keep=1)
    step_dir = tier.step_dir(2)
    step_dir.mkdir(parents=True)
    (step_dir / "__1_0.distcp").write_bytes(b"rank 1's part")
    real_iterdir = Path.iterdir

    def iterdir_after_the_peer(self: Path) -> Any:
        if self == step_dir:
            shutil.rmtree(self)  # rank 0, just now
        return real_iterdir(self)

    monkeypatch.setattr(Path, "iterdir", iterdir_after_the_peer)
    tier._remove_own(2)
    assert not step_dir.exists()
    assert tier.own_files(step_dir) == []
