"""Tier 1: faults recovered inside the same processes by the NVRx Wrapper (2 gloo ranks under torchrun).

Every test runs the real `python -m trainer` command line, as the chart does (helpers in _jobs.py), with
the chart's checkpoint mode, nvrx. Its saves commit at a later step than they start, so a fault that must
find a given checkpoint committed fires at the step right after the next save started: at the start of
step 6 (saves after steps 2, 5, 8) step 2 is committed and step 5 usually not (how many steps a commit
takes depends on the load: the tests read which one was newest, `newest_commit_before`).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests.trainer._jobs import (
    assert_completed,
    log_tail,
    newest_commit_before,
    of,
    read_events,
    run_job,
    torchrun,
    trainer_args,
)


@pytest.mark.slow
@pytest.mark.soak  # make test: test_exact_resume.py checks the same in-process restart (and 4 ranks below)
def test_exception_recovers_in_process_with_the_same_pids(tmp_path: Path, token_file: Path) -> None:
    out, log = tmp_path / "run", tmp_path / "job.log"
    rc = run_job(
        [*torchrun(), *trainer_args(token_file, out, "--inprocess", "--fault=exception:step=6:rank=1")], log
    )
    assert rc == 0, log_tail(log)
    summary = assert_completed(out, log)
    evs = read_events(out)

    for rank in (0, 1):
        starts = of(evs, "run_start", rank=rank)
        assert [e["iteration"] for e in starts] == [0, 1], "expected exactly one in-process restart"
        assert len({e["pid"] for e in starts}) == 1, "the process was replaced: not an in-process restart"
        assert {e["restart"] for e in starts} == {0}
        detected = of(evs, "fault_detected", rank=rank)
        assert [(d["tier"], d["iteration"]) for d in detected] == [(1, 1)]  # emitted as iteration 1 starts
        # The new iteration reloaded the newest committed checkpoint (step 2; 5 was usually pending).
        (restore,) = of(evs, "restore", rank=rank, iteration=1)
        assert 2 <= restore["step"] == newest_commit_before(evs, restore["t"]) < 6
    assert "InjectedFault" in of(evs, "fault_detected", rank=1)[0]["reason"]
    # The peer was not left waiting for the 3 s collective timeout: it saw the closed connection.
    assert "Timed out" not in of(evs, "fault_detected", rank=0)[0]["reason"]

    (fault,) = summary["faults"]
    assert (fault["type"], fault["tier"], fault["recovered"]) == ("exception", 1, True)
    restored = of(evs, "restore", rank=0, iteration=1)[0]["step"]
    assert fault["restored_step"] == restored and fault["steps_recomputed"] == 6 - restored - 1


@pytest.mark.slow
def test_four_rank_exception_recovers_without_waiting_for_the_collective_timeout(
    tmp_path: Path, token_file: Path
) -> None:
    # With 4 ranks, rank 3 may be blocked in a collective that involves only survivors (ring all-gather:
    # it sends to 0 and receives from 2), so it is released only when the survivors' groups close their
    # sockets; a survivor whose traceback still held the model kept them open for the whole timeout.
    out, log = tmp_path / "run", tmp_path / "job.log"
    timeouts = ["--collective-timeout=20", "--inprocess-soft-timeout=25", "--inprocess-hard-timeout=30",
                "--inprocess-barrier-timeout=40", "--heartbeat-timeout=60"]  # fmt: skip
    fault = "--fault=exception:step=5:rank=1"
    # sync, not the chart's nvrx: with 4 ranks on 2 loaded cores, the 4 NVRx workers' cold start after the
    # restart held one rank in its first save past the 20 s collective timeout of a peer (a second,
    # spurious restart). This test is about the abort, not the writer.
    extra = ["--inprocess", fault, "--ckpt-mode=sync", *timeouts]
    argv = [*torchrun(nproc=4), *trainer_args(token_file, out, *extra, steps=8)]
    assert run_job(argv, log) == 0, log_tail(log)
    evs = read_events(out)
    (injected,) = of(evs, "fault_injected")
    detected = {d["rank"]: d for d in of(evs, "fault_detected")}
    assert sorted(detected) == [0, 1, 2, 3], log_tail(log)
    for rank, d in detected.items():
        assert (d["tier"], d["iteration"]) == (1, 1)
        waited = d["t_caught"] - injected["t"]
        assert waited < 10, f"rank {rank} caught the fault after {waited:.1f} s: {d['reason']}"
    assert of(evs, "run_end", status="completed", step=7, rank=0)


@pytest.mark.slow
def test_hang_in_python_recovers_in_process(tmp_path: Path, token_file: Path) -> None:
    # Rank 1 loops in Python; rank 0's collective times out (_jobs.RUN_VALUES collectiveTimeout), the
    # Wrapper interrupts rank 1's loop. 6 steps: the restarted iteration trains 2 more, not 6.
    out, log = tmp_path / "run", tmp_path / "job.log"
    rc = run_job([*torchrun(), *trainer_args(token_file, out, "--fault=hang:step=4:rank=1", steps=6)], log)
    assert rc == 0, log_tail(log)
    summary = assert_completed(out, log, steps=6)
    evs = read_events(out)
    for rank in (0, 1):
        starts = of(evs, "run_start", rank=rank)
        assert len({e["pid"] for e in starts}) == 1 and [e["iteration"] for e in starts] == [0, 1]
    assert of(evs, "fault_detected", rank=1)[0]["reason"].startswith("RankShouldRestart")
    (fault,) = summary["faults"]
    assert (fault["type"], fault["tier"], fault["recovered"]) == ("hang", 1, True)


@pytest.mark.slow
def test_single_process_without_a_launcher_recovers_in_process(tmp_path: Path, token_file: Path) -> None:
    # `python -m trainer` alone: rank 0 of 1 on free ports, the Wrapper still restarts it in-process.
    out, log = tmp_path / "run", tmp_path / "job.log"
    env_less = [
        k for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT") if k in os.environ
    ]
    assert not env_less, f"the test runner itself sets {env_less}"
    argv = [sys.executable, *trainer_args(token_file, out, "--fault=exception:step=6", steps=7)]
    assert run_job(argv, log) == 0, log_tail(log)
    evs = read_events(out)
    assert [e["iteration"] for e in of(evs, "run_start")] == [0, 1]
    assert len({e["pid"] for e in evs}) == 1
    (restore,) = of(evs, "restore", iteration=1)
    assert 2 <= restore["step"] == newest_commit_before(evs, restore["t"]) < 6
    assert of(evs, "run_end", status="completed", step=6)


# A trainer whose snapshot clean-up after the last step raises once: a fault in the wind-down, after every
# rank has written run_end and passed the barrier behind it.
_WIND_DOWN_FAULT = """
import sys
from trainer.snapshot.manager import Snapshots
finish, raised = Snapshots.finish, []
def finish_once(self):
    if not raised:
        raised.append(1)
        raise RuntimeError("injected: wind-down fault")
    finish(self)
Snapshots.finish = finish_once
from trainer.__main__ import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.slow
def test_a_fault_after_completion_does_not_train_again(tmp_path: Path, token_file: Path) -> None:
    # Seen in CI under load: a restart after run_end re-ran the (empty) rest of the run and wrote a
    # second run_end "completed" for rank 0. The run is done once every rank has passed that barrier.
    out, log = tmp_path / "run", tmp_path / "job.log"
    args = trainer_args(token_file, out, "--snapshot-interval=1", f"--snapshot-dir={tmp_path / 'shm'}",
                        steps=3)  # fmt: skip
    assert args[:2] == ["-m", "trainer"], args
    argv = [sys.executable, "-c", _WIND_DOWN_FAULT, *args[2:]]
    assert run_job(argv, log) == 0, log_tail(log)
    assert "injected: wind-down fault" in log.read_text()
    evs = read_events(out)
    assert [e["iteration"] for e in of(evs, "run_start")] == [0], "training ran again after completion"
    (end,) = of(evs, "run_end")
    assert end["status"] == "completed" and end["step"] == 2
    assert not of(evs, "fault_detected"), "a wind-down fault is not a training fault"
    assert "not training again" in log.read_text()
    assert json.loads((out / "summary.json").read_text())["status"] == "completed"
    assert list((tmp_path / "shm").iterdir()) == [], "the clean-up was not finished after the restart"
