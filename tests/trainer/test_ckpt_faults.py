"""Checkpoint faults: a crash inside a save and a corrupted newest checkpoint, both recovered by a restart.

The crash kills a rank with SIGKILL, so recovery is a worker restart (torchrun --max-restarts here, the
same path ft_launcher takes); tier 1 is off to keep these runs short and about the checkpoint only.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.trainer._jobs import (
    assert_completed,
    log_tail,
    of,
    read_events,
    run_job,
    torchrun,
    trainer_args,
)


@pytest.mark.slow
def test_crash_inside_a_save_keeps_the_previous_checkpoint(tmp_path: Path, token_file: Path) -> None:
    # Saves follow steps 2, 5, 8 and the last step 9 (a run always ends with a committed checkpoint of its
    # last step); the crash hits rank 0 in the save of step 5, after its shard is durable.
    out, log = tmp_path / "run", tmp_path / "job.log"
    argv = [
        *torchrun(max_restarts=1),
        *trainer_args(token_file, out, "--no-inprocess", "--fault=ckpt-crash:step=4"),
    ]
    assert run_job(argv, log) == 0, log_tail(log)
    assert_completed(out, log)
    evs = read_events(out)

    (crash,) = of(evs, "fault_injected", fault="ckpt-crash")
    assert (crash["rank"], crash["step"], crash["restart"]) == (0, 5, 0)
    before = [e for e in evs if e["t"] < crash["t"]]
    assert [c["step"] for c in of(before, "ckpt_commit")] == [2], "step 5 must not be committed"
    # The restarted workers resumed from the previous checkpoint, passing over the half-written one.
    restored = of(evs, "restore", restart=1)
    assert sorted(r["rank"] for r in restored) == [0, 1] and {r["step"] for r in restored} == {2}
    skipped = of(evs, "ckpt_skipped", restart=1)
    assert skipped and all(s["reason"] for s in skipped)
    # Every visible checkpoint at the end is a complete one the run committed.
    commits = {c["step"] for c in of(evs, "ckpt_commit")}
    assert commits == {2, 5, 8, 9}  # 9: the last step is always committed (issue 9)
    visible = sorted(p.name for p in (out / "ckpt").iterdir() if p.is_dir() and not p.name.startswith("."))
    assert all(name.startswith("step_") for name in visible), visible


@pytest.mark.slow
def test_corrupt_newest_checkpoint_is_skipped_with_a_reason(tmp_path: Path, token_file: Path) -> None:
    # At the start of step 7 rank 0 corrupts the newest checkpoint (step 5) and dies.
    out, log = tmp_path / "run", tmp_path / "job.log"
    argv = [
        *torchrun(max_restarts=1),
        *trainer_args(token_file, out, "--no-inprocess", "--fault=ckpt-corrupt:step=7"),
    ]
    assert run_job(argv, log) == 0, log_tail(log)
    summary = assert_completed(out, log)
    evs = read_events(out)

    (fault,) = of(evs, "fault_injected", fault="ckpt-corrupt")
    assert (fault["rank"], fault["step"]) == (0, 7)
    (skipped,) = of(evs, "ckpt_skipped", restart=1)
    assert "5" in Path(skipped["path"]).name and skipped["reason"]
    assert {r["step"] for r in of(evs, "restore", restart=1)} == {2}
    assert summary["ckpt"]["skipped"] == [{"path": skipped["path"], "reason": skipped["reason"]}]
    assert summary["faults"][0]["restored_step"] == 2
