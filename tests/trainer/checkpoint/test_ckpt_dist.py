"""Checkpointing across processes: a 2-rank FSDP2 checkpoint loads on 1 rank (resharding), and a rank
killed inside the commit leaves the previous checkpoint loadable and nothing half-written visible.

Both read one 2-rank run (module fixture `saved`, nvrx, the chart's mode): the same processes first save
2 steps into `clean`, then 2 steps into `crash`, where the last rank is killed inside the commit of step 1.
Each test restores its own folder."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from tests.trainer._ckpt import make_state, snapshot, train_step
from tests.trainer._dist import run_ranks
from trainer.checkpoint import CheckpointConfig, CheckpointHooks, CheckpointManager, layout

pytestmark = pytest.mark.slow


def _train_and_save(rank: int, world_size: int, root: str, mode: str, crash_step: int) -> None:
    """Train 2 steps saving each; keep a full-state reference of step 0; optionally die in a commit."""

    def before_commit(step: int) -> None:
        if step == crash_step and rank == world_size - 1:
            os.kill(os.getpid(), signal.SIGKILL)  # the ckpt-crash fault: shards written, commit not done

    mesh = init_device_mesh("cpu", (world_size,))
    state = make_state(mesh)
    cfg = CheckpointConfig(dir=Path(root), interval_steps=1, keep_latest=3, mode=mode)  # type: ignore[arg-type]
    mgr = CheckpointManager(cfg, rank=rank, world_size=world_size, hooks=CheckpointHooks(before_commit))
    for step in range(2):
        train_step(state, step)
        mgr.save(step, state)
        mgr.wait()
        reference = snapshot(state)  # a collective: every rank takes part
        if rank == 0:
            torch.save(reference, Path(root) / f"reference_{step}.pt")
    mgr.close()
    dist.barrier()


def _restore_here(root: Path, mesh: Any) -> tuple[Any, dict[str, Any]]:
    state = make_state(mesh, seed=1)
    mgr = CheckpointManager(CheckpointConfig(dir=root, mode="sync"), rank=0, world_size=1)
    try:
        return mgr.load_latest(state), state
    finally:
        mgr.close()


def _clean_then_crash(rank: int, world_size: int, root: str) -> None:
    _train_and_save(rank, world_size, str(Path(root) / "clean"), "nvrx", -1)
    _train_and_save(rank, world_size, str(Path(root) / "crash"), "nvrx", 1)


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run's root: `clean` (steps 0 and 1 committed) and `crash` (step 1's commit cut off)."""
    root = tmp_path_factory.mktemp("ckpt-dist")
    with pytest.raises(Exception, match=r"SIGKILL|signal"):
        run_ranks(_clean_then_crash, 2, str(root))
    return root


def test_two_rank_checkpoint_loads_on_one_rank(saved: Path, one_rank: Any) -> None:
    root = saved / "clean"
    manifest = layout.scan(root)[0][0].manifest
    assert manifest is not None and manifest["world_size"] == 2
    assert {"__0_0.distcp", "__1_0.distcp"} <= set(manifest["files"])  # one shard file per rank
    restored, state = _restore_here(root, one_rank)
    assert (restored.step, restored.skipped) == (1, [])
    expected = torch.load(root / "reference_1.pt")
    got = snapshot(state)
    assert got.keys() == expected.keys()
    for key in expected:
        assert torch.equal(got[key], expected[key]), key
    assert state["trainer"].step == 1


def test_rank_killed_in_commit_leaves_previous_checkpoint(saved: Path, one_rank: Any) -> None:
    root = saved / "crash"
    assert sorted(p.name for p in root.glob("step_*")) == ["step_00000000"]  # step 1 never became visible
    leftover = root / layout.temp_name(1)
    assert (leftover / "__1_0.distcp").is_file()  # the killed rank had written its shard

    restored, state = _restore_here(root, one_rank)
    assert restored.step == 0
    assert [(Path(s.path).name, "never committed" in s.reason) for s in restored.skipped] == [
        (leftover.name, True)
    ]
    expected = torch.load(root / "reference_0.pt")
    got = snapshot(state)
    for key in expected:
        assert torch.equal(got[key], expected[key]), key
    assert not leftover.exists()
