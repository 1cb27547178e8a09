"""The numerical guard end to end: a NaN on one rank rolls both ranks back, the batch is skipped, and a
SIGKILL after the skip resumes from a state older than it, exactly.

Run A, the pod command (ft_launcher, 2 ranks, tier 1 on): snapshots after steps 2, 5, 8 and durable
saves after 7 and 9, so nothing newer than the snapshot of step 2 exists until step 5. Rank 1's gradients
become NaN in step 4 (`nan`): the optimizer's update is corrupt on rank 1's shards. The guard trips on
rank 1, both ranks restore the snapshot of step 2 and replay step 3, then step 4 on the next batch. At the
start of step 5 rank 0 is killed: the launcher restarts both workers, which restore the snapshot of step
2 from /dev/shm again, and only the record on disk makes them skip step 4's batch once more.

Run B starts with that record and no fault. Both end in the same state, bit for bit: a guard that kept any
of the NaN update, skipped another batch, or forgot the skip after the restart ends elsewhere.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.trainer._jobs import assert_completed, log_tail, of, pod_command, read_events, run_job

OPTIONS = ("--snapshot-interval=3", "--ckpt-interval=8", "--guard-window=3")


@pytest.mark.slow
def test_a_nan_is_rolled_back_its_batch_skipped_and_a_kill_after_it_resumes_exactly(
    token_file: Path, tmp_path: Path
) -> None:
    a, b = tmp_path / "a" / "run", tmp_path / "b" / "run"
    faults = ("--fault=nan:step=4:rank=1", "--fault=sigkill:step=5:rank=0")
    assert run_job(pod_command(token_file, a, *OPTIONS, *faults), tmp_path / "a.log") == 0, log_tail(
        tmp_path / "a.log"
    )
    summary = assert_completed(a, tmp_path / "a.log")
    evs = read_events(a)

    (tripped,) = of(evs, "guard_tripped")
    assert (tripped["rank"], tripped["step"]) == (1, 4) and "nan" in tripped["reason"], tripped
    (rollback,) = of(evs, "guard_rollback")
    assert (rollback["step"], rollback["restored_step"], rollback["ranks"]) == (4, 2, [1]), rollback
    # Nothing of the corrupt step was kept: no step event, snapshot or save of it before the rollback.
    before = [e for e in evs if e["t"] <= rollback["t"] and e.get("step") == 4]
    assert {e["ev"] for e in before} <= {"fault_injected", "guard_tripped", "guard_rollback"}, before
    assert all(e["loss"] == e["loss"] for e in of(evs, "step")), "a NaN loss was recorded"
    assert [r["source"] for r in of(evs, "restore", rank=1) if r["t"] > tripped["t"]][:1] == ["memory"]
    # The kill at step 5 went to tier 2, which restored the snapshot of step 2 (older than the skip).
    assert of(evs, "run_start", rank=0, restart=1), log_tail(tmp_path / "a.log")
    after_kill = [r for r in of(evs, "restore", rank=0) if r["restart"] == 1]
    assert [r["step"] for r in after_kill] == [2], after_kill
    assert summary["guard"]["rollbacks"] == 1 and summary["guard"]["skipped_steps"] == [4]
    # Step 4 ran twice more, after the rollback and after the kill, both from step 2's state: on the same
    # (next) batch, so with the same loss; a restart that forgot the skip would have trained on step 4's.
    losses = [e["loss"] for e in of(evs, "step", step=4)]
    assert len(losses) == 2 and losses[0] == losses[1], losses
    record = json.loads((a / "guard" / "skipped.json").read_text())
    assert record == {"skips": {"4": 1}, "trips": {"1": 1}}

    (b / "guard").mkdir(parents=True)
    (b / "guard" / "skipped.json").write_text(json.dumps({"skips": {"4": 1}}))
    assert run_job(pod_command(token_file, b, *OPTIONS), tmp_path / "b.log") == 0, log_tail(
        tmp_path / "b.log"
    )
    assert_completed(b, tmp_path / "b.log")
    assert not of(read_events(b), "guard_rollback")
    assert [e["loss"] for e in of(read_events(b), "step", step=4)] == losses[:1]
    (end_a,) = of(evs, "run_end", rank=0, status="completed")
    (end_b,) = of(read_events(b), "run_end", rank=0, status="completed")
    assert end_a["state_sha256"] == end_b["state_sha256"], (end_a["state_parts"], end_b["state_parts"])
