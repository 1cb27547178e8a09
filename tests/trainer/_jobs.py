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

from tests.helpers import REPO_ROOT, free_port
from tools.podcommand import LocalPlaces, pod_argv, trainer_argv, with_options

STEPS = 10
CKPT_INTERVAL = 3  # saves after steps 2, 5, 8
JOB_TIMEOUT_S = 240
# The chart values (k8s/values.yaml names) of the small, fast CPU run every test here starts from; the
# command itself comes from the rendered chart (tools/podcommand.py), as a pod runs it.
RUN_VALUES: dict[str, Any] = {
    "preset": "tiny",
    "seqLen": 32,
    "microBatchSize": 2,
    "steps": STEPS,
    "ckptInterval": CKPT_INTERVAL,
    "ckptKeep": 3,
    "ckptMode": "nvrx",  # the chart default (k8s/values.yaml): the mode every fault test runs
    "seed": 11,
    # Recovery from the durable checkpoint, as these tests assert it; the snapshot tests turn snapshots on.
    "snapshotInterval": 0,
    # Nested as trainer/resilience/timeouts.py requires; short so a hang costs seconds, not minutes, yet
    # above what a healthy step and save take on a loaded 2-core machine: at 3 s / 5 s a whole suite's load
    # made healthy ranks time out and restart in-process again and again (seen: 8 iterations in one run).
    "collectiveTimeout": 10,
    "inprocessSoftTimeout": 15,
    "inprocessHardTimeout": 40,
    "inprocessBarrierTimeout": 50,
    "ftRankHeartbeatTimeout": 70,
    # ft_launcher: 2 local ranks with heartbeat monitoring, short timeouts.
    "nodes": 1,
    "gpusPerNode": 2,
    "maxRestarts": 2,
    "monitorInterval": 0.5,
    "ftInitialRankHeartbeatTimeout": 120,
    "ftWorkloadCheckInterval": 1,
    "workersStopTimeout": 5,
    "terminationGracePeriodSeconds": 15,  # --term-timeout=5
    "rdzvJoinTimeout": 600,  # torch's own default
}


def trainer_args(data: Path, out: Path, *extra: str, steps: int = STEPS) -> list[str]:
    """The trainer's part of the pod command (`-m trainer ...`) for a small, fast CPU run, with `extra`
    last among the trainer's options (before the reference model's, after `--`)."""
    argv = trainer_argv({**RUN_VALUES, "steps": steps}, LocalPlaces(free_port(), data, out))
    return with_options(argv, extra)


def pod_command(data: Path, out: Path, *extra: str, max_restarts: int = 2) -> list[str]:
    """The whole pod command (ft_launcher, 2 local ranks, then the trainer), `extra` last among the
    trainer's options."""
    values = {**RUN_VALUES, "maxRestarts": max_restarts}
    return with_options(pod_argv(values, LocalPlaces(free_port(), data, out)), extra)


def torchrun(max_restarts: int = 0, nproc: int = 2) -> list[str]:
    """torchrun for `nproc` local ranks; workers are restarted (all of them) up to max_restarts times."""
    exe = str(Path(sys.executable).with_name("torchrun"))
    return [exe, "--nnodes=1", f"--nproc-per-node={nproc}", "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{free_port()}", f"--max-restarts={max_restarts}",
            "--monitor-interval=0.2"]  # fmt: skip


def run_job(argv: list[str], log: Path, timeout_s: float = JOB_TIMEOUT_S) -> int:
    """Run a launcher command in its own session; kill the whole session if it outlives timeout_s."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT)}
    # The launcher picks MASTER_PORT from the ephemeral range; the trainer's stores at MASTER_PORT+1/+2
    # could then collide with any client socket (EADDRINUSE in CI): give them ports outside that range.
    stores = free_port(span=2)
    env.setdefault("TRAINER_PG_PORT", str(stores))
    env.setdefault("TRAINER_INPROCESS_PORT", str(stores + 1))
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


def newest_commit_before(evs: list[dict[str, Any]], t: float) -> int:
    """The newest checkpoint step committed before time `t` (-1: none): what a restore at `t` loads.
    nvrx commits a save some steps after it starts it, how many depends on the machine's load: a fault at
    the step after a save started usually finds the previous one newest, but not surely (a suite saw the
    save after step 5 committed before the exception at step 6)."""
    return max((int(e["step"]) for e in of(evs, "ckpt_commit") if float(e["t"]) < t), default=-1)


def assert_completed(out: Path, log: Path, steps: int = STEPS) -> dict[str, Any]:
    """The run ended with every step done by rank 0 and both ranks reporting completion."""
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed", log_tail(log)
    assert summary["final_step"] == steps - 1
    evs = read_events(out)
    assert {e["step"] for e in of(evs, "step")} == set(range(steps))
    assert {e["rank"] for e in of(evs, "run_end", status="completed")} == {0, 1}
    return summary
