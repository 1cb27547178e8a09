"""Exactness with snapshots on, for the hang fault: every rank stuck in Python at one step, caught the way
the chart's defaults catch it, restored from the pod's /dev/shm, and the final model + optimizer state
equal, bit for bit, to the session's fault-free run (conftest `clean_run`).

Which detector acts is the chart's choice: after `hangWarmupSteps` the launcher's heartbeat timeout is
calculated from the measured step time, `max(hangTimeoutFloor, hangTimeoutFactor x longest step)` (60 s
in k8s/values.yaml), well under the in-process Wrapper's soft timeout (180 s), so ft_launcher stops the
hung workers (tier 2) and new workers restore the snapshot the hung ones left in /dev/shm (`shm`). The
test keeps that order in seconds: floor 8 s and the Wrapper's soft timeout 100 s, above 3 x the longest
interval a loaded 2-core machine measures (the first nvrx save's worker start took over 23 s in one run:
its calculated timeout reached the 70 s static one and a 40 s soft timeout fired first), with the
whole static chain below a 150 s static heartbeat timeout.
Every rank hangs, so no collective is pending and nothing but the heartbeat can notice (the one-rank
hang whose peer's collective times out first is tier 1's case: test_inprocess.py). The checkpoint mode
is the chart's (nvrx), snapshots every step as the chart ships them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import free_port
from tests.trainer._jobs import RUN_VALUES, assert_completed, log_tail, of, read_events, run_job
from tools.podcommand import LocalPlaces, pod_argv

HANG_STEP = 7  # after the warm-up (4 intervals: the save after step 2 and snapshots among them)
FLOOR_S = 8
STATIC_S = 150  # the static heartbeat timeout: the calculated one never exceeds it


@pytest.mark.slow
@pytest.mark.soak  # 98-195 s on 2 loaded cores (a hang timeout and a worker restart), + the clean run
def test_hang_with_snapshots_restores_from_shm_and_ends_exact(
    tmp_path: Path, token_file: Path, clean_run: tuple[Path, str]
) -> None:
    values = {
        **RUN_VALUES,
        "snapshotInterval": 1,  # the chart's default
        "ckptMode": "nvrx",  # the chart's default (RUN_VALUES has it too: stated, as the point here)
        "hangTimeoutFloor": FLOOR_S,
        "hangTimeoutFactor": 3,
        "hangWarmupSteps": 4,
        "inprocessLivenessTimeout": 1.5,  # below the floor, as the chart requires
        "ftWorkloadCheckInterval": 0.5,
        # The static chain (collective < soft < hard < barrier < heartbeat <= initial heartbeat), with the
        # Wrapper's soft timeout well above the calculated hang timeout, as in the chart's defaults.
        "collectiveTimeout": 20,
        "inprocessSoftTimeout": 100,
        "inprocessHardTimeout": 110,
        "inprocessBarrierTimeout": 120,
        "ftRankHeartbeatTimeout": STATIC_S,
        "ftInitialRankHeartbeatTimeout": STATIC_S,
        "faults": {"a": f"hang:step={HANG_STEP}:rank=0", "b": f"hang:step={HANG_STEP}:rank=1"},
    }
    out, log = tmp_path / "run", tmp_path / "job.log"
    rc = run_job(pod_argv(values, LocalPlaces(free_port(), token_file, out)), log, timeout_s=400)
    assert rc == 0, log_tail(log)
    summary = assert_completed(out, log)
    evs = read_events(out)

    # The launcher's heartbeat timeout caught it (calculated: at most the static one), not the Wrapper.
    assert "Did not get subsequent heartbeat" in log.read_text(errors="replace"), log_tail(log)
    t_hang = min(float(e["t"]) for e in of(evs, "fault_injected"))
    restarted = min(float(e["t"]) for e in of(evs, "run_start", restart=1))
    assert not of(evs, "run_start", iteration=1), "the Wrapper restarted in-process first"
    state = json.loads((out / "hang-timeouts" / "rank0.json").read_text())  # NVRx's persisted timeouts
    calculated = state["current_timeouts"]["heartbeat"]
    assert calculated["were_calculated"], calculated
    assert FLOOR_S <= restarted - t_hang < values["inprocessSoftTimeout"], (restarted - t_hang, calculated)

    # Both hangs were recovered by new workers from the snapshot the hung ones left in /dev/shm: the
    # newest whole one is the step before the hang, so at most one step is recomputed.
    assert len(summary["faults"]) == 2, summary["faults"]
    for fault in summary["faults"]:
        assert (fault["type"], fault["step"], fault["tier"]) == ("hang", HANG_STEP, 2), fault
        assert fault["recovered"] and fault["restored_from"] == "shm", fault
        assert fault["restored_step"] == HANG_STEP - 1 and fault["steps_recomputed"] <= 1, fault
    restores = of(evs, "restore", restart=1)
    assert {r["rank"] for r in restores} == {0, 1}
    assert {(r["step"], r["source"]) for r in restores} == {(HANG_STEP - 1, "shm")}, restores
    assert {e["mode"] for e in of(evs, "ckpt_save")} == {"nvrx"}

    (end,) = of(evs, "run_end", rank=0, status="completed")  # one: nothing restarted the finished run
    assert end["state_sha256"] == clean_run[1]
