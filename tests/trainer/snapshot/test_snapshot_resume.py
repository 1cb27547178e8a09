"""Snapshots make a fault cost at most one step, and change nothing in the final state.

Run A: no faults, no snapshots (the reference: the session's fault-free run, conftest `clean_run`).
Run B: snapshots every step, NVRx async checkpoints (the chart's mode), under ft_launcher with tier 1
on; an exception (recovered in-process from the process's own snapshot: `memory`) and later a SIGKILL
(recovered by new worker processes from the snapshot the killed one left behind: `shm`). The final sha256
of the full model + optimizer state must be equal, and each fault recomputes at most one step.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.trainer._jobs import (
    assert_completed,
    log_tail,
    of,
    pod_command,
    read_events,
    run_job,
)


def _final_hash(out: Path) -> str:
    (end,) = of(read_events(out), "run_end", rank=0, status="completed")
    return str(end["state_sha256"])


@pytest.mark.slow
def test_faults_restore_from_memory_and_shm_recompute_at_most_one_step_and_end_exact(
    tmp_path: Path, token_file: Path, clean_run: tuple[Path, str]
) -> None:
    shm = tmp_path / "shm"
    faulty, faulty_log = tmp_path / "faulty", tmp_path / "faulty.log"
    # the checkpoint mode the chart ships (the clean run saves with sync: the writer must not matter)
    extra = ["--snapshot-interval=1", f"--snapshot-dir={shm}", "--ckpt-mode=nvrx"]
    faults = ["--fault=exception:step=4:rank=1", "--fault=sigkill:step=7:rank=0"]
    argv = pod_command(token_file, faulty, *extra, *faults)
    # two faults, each with a process or iteration restart: a loaded 2-core machine needs the longer bound
    assert run_job(argv, faulty_log, timeout_s=600) == 0, log_tail(faulty_log)
    summary = assert_completed(faulty, faulty_log)
    evs = read_events(faulty)

    got = [(f["type"], f["tier"], f["restored_from"], f["recovered"]) for f in summary["faults"]]
    assert got == [("exception", 1, "memory", True), ("sigkill", 2, "shm", True)], summary["faults"]
    for fault in summary["faults"]:
        # the fault fires before its step runs: the snapshot of the step before it is the newest whole one
        # (SIGKILL can land while that snapshot's checksum is being written: then one step is redone)
        assert fault["restored_step"] in (fault["step"] - 1, fault["step"] - 2), fault
        assert fault["steps_recomputed"] <= 1, fault
    assert summary["steps_recomputed"] <= 2
    # every rank restored the same step from the same kind of source, each time
    for restart, iteration in [(0, 1), (1, 0)]:
        restores = of(evs, "restore", restart=restart, iteration=iteration)
        assert {r["rank"] for r in restores} == {0, 1}
        assert len({(r["step"], r["source"]) for r in restores}) == 1, restores
    snaps = of(evs, "snapshot", rank=0)
    assert snaps and all(s["bytes"] > 0 and s["blocked_s"] >= 0 for s in snaps)
    assert summary["snapshot"]["snapshots"] >= 10
    assert list(shm.iterdir()) == [], "a completed run leaves its snapshots in /dev/shm"

    assert _final_hash(faulty) == clean_run[1]
