"""Checkpoint faults: a crash inside a save and a corrupted newest checkpoint, each recovered by a restart.

The crash kills a rank with SIGKILL, so recovery is a worker restart (torchrun --max-restarts here, the
same path ft_launcher takes); tier 1 is off to keep these runs short and about the checkpoint only.
Both run the chart's checkpoint mode, nvrx (_jobs.RUN_VALUES): a save is written by NVRx's worker while
training goes on and committed by the manager's commit thread, so the crash lands in a save still in
flight. Whether the save before the corruption is committed by then depends on timing: both outcomes are
checked.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.trainer._jobs import (
    JOB_TIMEOUT_S,
    assert_completed,
    log_tail,
    of,
    read_events,
    run_job,
    torchrun,
    trainer_args,
)
from trainer.checkpoint import layout


@pytest.mark.slow
def test_a_crash_inside_a_save_then_a_corrupt_newest_checkpoint_are_both_passed_over(
    tmp_path: Path, token_file: Path
) -> None:
    """One run, two faults, two worker restarts (one run instead of two: a start-up and the first steps,
    saves included, are most of such a run's time).

    1. Saves follow steps 2, 5, 8 and the last step 9 (a run always ends with a committed checkpoint of its
    last step); the crash hits rank 0 in the save of step 5, after its shard is durable, before the commit
    (in the commit thread, while the loop trains on). The restarted workers resume from step 2 and train
    steps 3-9 as a fresh run trains them.
    2. At the start of step 9 of that second start rank 0 corrupts the newest committed checkpoint and
    dies. Steps 2 and 5 are committed by then (the save of 8 joined the commit of 5); the save of step 8,
    started just before, is committed or still in flight, depending on how fast its thread was.
    """
    out, log = tmp_path / "run", tmp_path / "job.log"
    faults = ["--fault=ckpt-crash:step=4", "--fault=ckpt-corrupt:step=9"]
    argv = [*torchrun(max_restarts=2), *trainer_args(token_file, out, "--no-inprocess", *faults)]
    # Three starts: twice the single-start bound (seen: 236 s at a load average of 10 on 2 cores).
    assert run_job(argv, log, timeout_s=2 * JOB_TIMEOUT_S) == 0, log_tail(log)
    summary = assert_completed(out, log)
    evs = read_events(out)

    # 1: the crash inside a save keeps the previous checkpoint.
    (crash,) = of(evs, "fault_injected", fault="ckpt-crash")
    assert (crash["rank"], crash["step"], crash["restart"]) == (0, 5, 0)
    before = [e for e in evs if e["t"] < crash["t"]]
    assert [c["step"] for c in of(before, "ckpt_commit")] == [2], "step 5 must not be committed"
    # It was an NVRx async save: save() returned (its event) before the commit the crash cut off.
    (started,) = of(before, "ckpt_save", rank=0, step=5)
    assert started["mode"] == "nvrx"
    # The restarted workers resumed from the previous checkpoint, passing over the half-written one.
    restored = of(evs, "restore", restart=1)
    assert sorted(r["rank"] for r in restored) == [0, 1] and {r["step"] for r in restored} == {2}
    skipped = of(evs, "ckpt_skipped", restart=1)
    assert skipped and all(s["reason"] for s in skipped)

    # 2: the corrupt newest checkpoint is skipped with a reason.
    (fault,) = of(evs, "fault_injected", fault="ckpt-corrupt")
    assert (fault["rank"], fault["step"], fault["restart"]) == (0, 9, 1)
    committed = [c["step"] for c in of(evs, "ckpt_commit") if c["t"] < fault["t"]]
    assert committed in ([2, 5], [2, 5, 8]), committed
    newest, previous = committed[-1], committed[-2]
    skipped_last = {Path(s["path"]).name: s["reason"] for s in of(evs, "ckpt_skipped", restart=2)}
    corrupted = f"step_{newest:08d}"
    expected = {corrupted} if newest == 8 else {corrupted, Path(layout.temp_name(8)).name}
    assert skipped_last.keys() == expected, skipped_last
    assert "checksum mismatch" in skipped_last[corrupted]  # the corrupted one: skipped with why
    if newest == 5:  # the save of 8 was still in flight when the fault cut it off
        assert "never committed" in skipped_last[Path(layout.temp_name(8)).name]
    assert {r["step"] for r in of(evs, "restore", restart=2)} == {previous}
    # The summary lists every checkpoint passed over, by either restart, with its reason.
    assert sorted(summary["ckpt"]["skipped"], key=lambda s: s["path"]) == sorted(
        ({"path": s["path"], "reason": s["reason"]} for s in of(evs, "ckpt_skipped")),
        key=lambda s: s["path"],
    )
    assert [(f["type"], f["restored_step"]) for f in summary["faults"]] == [
        ("ckpt-crash", 2),
        ("ckpt-corrupt", 2),
    ]

    # Every visible checkpoint at the end is a complete one the run committed.
    commits = {c["step"] for c in of(evs, "ckpt_commit")}
    assert commits == {2, 5, 8, 9}  # 9: the last step is always committed
    visible = sorted(p.name for p in (out / "ckpt").iterdir() if p.is_dir() and not p.name.startswith("."))
    assert all(name.startswith("step_") for name in visible), visible
