"""Tier 1: faults recovered inside the same processes by the NVRx Wrapper (2 gloo ranks under torchrun).

The helpers at the top (`run_job`, `read_events`, ...) are shared with test_ckpt_faults.py and
test_exact_resume.py: every test runs the real `python -m trainer` command line, as the chart does.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO_ROOT, free_port

STEPS = 10
CKPT_INTERVAL = 3  # saves after steps 2, 5, 8
# Nested as trainer/resilience/timeouts.py requires; short so a hang costs seconds, not minutes.
TIMEOUTS = ["--collective-timeout=3", "--inprocess-soft-timeout=5", "--inprocess-hard-timeout=30",
            "--inprocess-barrier-timeout=40", "--heartbeat-timeout=60"]  # fmt: skip
JOB_TIMEOUT_S = 240


@pytest.fixture(scope="module")
def token_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from trainer.data import write_synthetic_tokens
    from trainer.model import PRESETS

    return write_synthetic_tokens(
        tmp_path_factory.mktemp("data") / "tokens.npy", 100_000, PRESETS["tiny"].vocab_size, seed=3
    )


def trainer_args(data: Path, out: Path, *extra: str, steps: int = STEPS) -> list[str]:
    """The trainer's options for a small, fast CPU run."""
    return [
        "-m", "trainer", "--preset=tiny", f"--data-path={data}", "--seq-len=32", "--micro-batch-size=2",
        f"--steps={steps}", f"--ckpt-interval={CKPT_INTERVAL}", "--ckpt-keep=3", "--ckpt-mode=sync",
        f"--out-dir={out}", "--device=cpu", "--seed=11", *TIMEOUTS, *extra,
    ]  # fmt: skip


def torchrun(max_restarts: int = 0, nproc: int = 2) -> list[str]:
    """torchrun for `nproc` local ranks; workers are restarted (all of them) up to max_restarts times."""
    exe = str(Path(sys.executable).with_name("torchrun"))
    return [exe, "--nnodes=1", f"--nproc-per-node={nproc}", "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{free_port()}", f"--max-restarts={max_restarts}",
            "--monitor-interval=0.2"]  # fmt: skip


def ft_launcher(max_restarts: int = 2) -> list[str]:
    """ft_launcher for 2 local ranks with heartbeat monitoring (Contract 2's flags, short timeouts)."""
    exe = str(Path(sys.executable).with_name("ft_launcher"))
    return [
        exe, "--nnodes=1", "--nproc-per-node=2", "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{free_port()}", "--rdzv-id=loop-test",
        f"--max-restarts={max_restarts}", "--monitor-interval=0.5", "--ft-restart-policy=any-failed",
        "--ft-rank-heartbeat-timeout=60", "--ft-initial-rank-heartbeat-timeout=120",
        "--ft-workload-check-interval=1", "--workers-stop-timeout=5", "--term-timeout=5",
    ]  # fmt: skip


def run_job(argv: list[str], log: Path, timeout_s: float = JOB_TIMEOUT_S) -> int:
    """Run a launcher command in its own session; kill the whole session if it outlives timeout_s."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT)}
    with open(log, "w") as fh:
        proc = subprocess.Popen(argv, cwd=REPO_ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                start_new_session=True)  # fmt: skip
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise AssertionError(f"job did not finish in {timeout_s} s:\n{log_tail(log)}") from None


def log_tail(log: Path, chars: int = 4000) -> str:
    return log.read_text(errors="replace")[-chars:]


def read_events(out: Path) -> list[dict[str, Any]]:
    """Every rank's events, sorted by time."""
    evs = [
        json.loads(line)
        for p in sorted(out.glob("events.rank*.jsonl"))
        for line in p.read_text().splitlines()
    ]
    return sorted(evs, key=lambda e: float(e["t"]))


def of(evs: list[dict[str, Any]], ev: str, **match: Any) -> list[dict[str, Any]]:
    return [e for e in evs if e["ev"] == ev and all(e.get(k) == v for k, v in match.items())]


def assert_completed(out: Path, log: Path, steps: int = STEPS) -> dict[str, Any]:
    """The run ended with every step done by rank 0 and both ranks reporting completion."""
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed", log_tail(log)
    assert summary["final_step"] == steps - 1
    evs = read_events(out)
    assert {e["step"] for e in of(evs, "step")} == set(range(steps))
    assert {e["rank"] for e in of(evs, "run_end", status="completed")} == {0, 1}
    return summary


@pytest.mark.slow
def test_exception_recovers_in_process_with_the_same_pids(tmp_path: Path, token_file: Path) -> None:
    out, log = tmp_path / "run", tmp_path / "job.log"
    rc = run_job(
        [*torchrun(), *trainer_args(token_file, out, "--inprocess", "--fault=exception:step=5:rank=1")], log
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
        # The new iteration reloaded the newest checkpoint before step 5: the one of step 2.
        assert [r["step"] for r in of(evs, "restore", rank=rank, iteration=1)] == [2]
    assert "InjectedFault" in of(evs, "fault_detected", rank=1)[0]["reason"]
    # The peer was not left waiting for the 3 s collective timeout: it saw the closed connection.
    assert "Timed out" not in of(evs, "fault_detected", rank=0)[0]["reason"]

    (fault,) = summary["faults"]
    assert (fault["type"], fault["tier"], fault["recovered"]) == ("exception", 1, True)
    assert fault["restored_step"] == 2 and fault["steps_recomputed"] == 2


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
    argv = [*torchrun(nproc=4), *trainer_args(token_file, out, "--inprocess", fault, *timeouts, steps=8)]
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
    # Rank 1 loops in Python; rank 0's collective times out (3 s), the Wrapper interrupts rank 1's loop.
    out, log = tmp_path / "run", tmp_path / "job.log"
    rc = run_job([*torchrun(), *trainer_args(token_file, out, "--fault=hang:step=4:rank=1")], log)
    assert rc == 0, log_tail(log)
    summary = assert_completed(out, log)
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
    argv = [sys.executable, *trainer_args(token_file, out, "--fault=exception:step=4", steps=6)]
    assert run_job(argv, log) == 0, log_tail(log)
    evs = read_events(out)
    assert [e["iteration"] for e in of(evs, "run_start")] == [0, 1]
    assert len({e["pid"] for e in evs}) == 1
    assert [r["step"] for r in of(evs, "restore", iteration=1)] == [2]
    assert of(evs, "run_end", status="completed", step=5)
