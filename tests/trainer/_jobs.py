"""Run the trainer's real command line under torchrun or ft_launcher and read what it wrote (a helper
module shared by test_inprocess.py, test_ckpt_faults.py and test_exact_resume.py, not a test module)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.conftest import REPO_ROOT, free_port

STEPS = 10
CKPT_INTERVAL = 3  # saves after steps 2, 5, 8
# Nested as trainer/resilience/timeouts.py requires; short so a hang costs seconds, not minutes.
TIMEOUTS = ["--collective-timeout=3", "--inprocess-soft-timeout=5", "--inprocess-hard-timeout=30",
            "--inprocess-barrier-timeout=40", "--heartbeat-timeout=60"]  # fmt: skip
JOB_TIMEOUT_S = 240


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
