"""Commits in the background (trainer/checkpoint/committer.py, CheckpointManager commit_in_background).

The training loop's manager commits each asynchronous save in a thread of its own: the save commits
while the caller makes no checkpoint call at all, the caller's maybe_finalize does nothing, and a
failed save reaches every rank at its next wait (the same call on every rank), never earlier.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from torch.distributed.device_mesh import init_device_mesh

from tests.trainer._ckpt import make_state, train_step
from tests.trainer._dist import run_ranks
from trainer.checkpoint import CheckpointConfig, CheckpointHooks, CheckpointManager
from trainer.checkpoint.committer import BackgroundCommit
from trainer.checkpoint.errors import CheckpointWriteError


def _saves_committed_by_the_thread(rank: int, world_size: int, root: str) -> None:
    """Save 0 and wait for its commit without a checkpoint call; then save 1, whose rank-1 write fails,
    and see the failure at wait() on both ranks."""
    state = make_state(init_device_mesh("cpu", (world_size,)))
    train_step(state, 0)

    def fail_step_1(step: int) -> None:
        if step == 1 and rank == 1:
            raise OSError(28, "no space left on device (test)")

    cfg = CheckpointConfig(
        dir=Path(root) / "ckpt", interval_steps=1, mode="torch-async", collective_timeout_s=20
    )
    mgr = CheckpointManager(
        cfg, rank=rank, world_size=world_size, hooks=CheckpointHooks(after_write=fail_step_1),
        commit_in_background=True,
    )  # fmt: skip
    report: dict[str, Any] = {}
    try:
        mgr.save(0, state)
        report["finalize_returned"] = mgr.maybe_finalize()  # the loop's per-step call: nothing to do
        deadline = time.monotonic() + 60
        while mgr.committed_step < 0 and time.monotonic() < deadline:
            time.sleep(0.05)  # no checkpoint call here: only the commit thread can commit
        report["committed_without_a_call"] = mgr.committed_step
        report["step_dirs"] = sorted(p.name for p in cfg.dir.glob("step_*"))
        train_step(state, 1)
        mgr.save(1, state)
        time.sleep(2.0)  # long enough for the thread to agree that rank 1 failed
        report["finalize_after_failure"] = mgr.maybe_finalize()  # not raised here: only at the wait
        try:
            mgr.wait()
            report["wait"] = "returned"
        except CheckpointWriteError as exc:
            report["wait"] = f"CheckpointWriteError(step {exc.step})"
        report["step_dirs_after"] = sorted(p.name for p in cfg.dir.glob("step_*"))
    finally:
        mgr.close()
    Path(root, f"report{rank}.json").write_text(json.dumps(report))


@pytest.mark.slow
def test_a_background_commit_needs_no_loop_call_and_its_failure_surfaces_at_the_wait(tmp_path: Path) -> None:
    run_ranks(_saves_committed_by_the_thread, 2, str(tmp_path), timeout_s=180)
    reports = [json.loads((tmp_path / f"report{rank}.json").read_text()) for rank in (0, 1)]
    for report in reports:
        assert report["finalize_returned"] == [], reports
        assert report["committed_without_a_call"] == 0, reports
        assert report["finalize_after_failure"] == [], reports
        assert report["wait"] == "CheckpointWriteError(step 1)", reports
    assert reports[0]["step_dirs"] == reports[0]["step_dirs_after"] == ["step_00000000"], reports


def test_a_join_pings_progress_while_the_thread_runs_and_raises_its_error() -> None:
    release = threading.Event()
    pings: list[float] = []

    def slow_failure() -> list[int]:
        release.wait(5.0)
        raise CheckpointWriteError("checkpoint of step 3 failed: test", 3)

    commit = BackgroundCommit(slow_failure, 3)
    commit.JOIN_POLL_S = 0.05
    threading.Timer(0.3, release.set).start()
    with pytest.raises(CheckpointWriteError, match="step 3"):
        commit.join(lambda: pings.append(time.monotonic()))
    assert commit.done
    assert len(pings) >= 2  # the caller's watchdog was fed while it waited


def test_a_join_returns_the_committed_steps() -> None:
    commit = BackgroundCommit(lambda: [7], 7)
    assert commit.join() == [7]
