"""Run local pods as one Job for bench's recovery scenarios (bench.recovery, bench.recovery_pods,
bench.node_loss_phases): the environment every pod gets, a fresh run directory, and the poll loop under a
time limit around tools/localjob.py LocalJob, so each scenario only says which pods and what to watch."""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tools.localjob import JobResult, LocalJob, PodSpec
from trainer.runtime.ports import free_port

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class JobRun:
    result: JobResult
    elapsed_s: float
    load_avg_1min: float
    """The machine's load when the job started: a shared machine's figures scale with what else runs."""
    attempts_of_first: int
    """How many times index 0's pod was started."""


def fresh(run_dir: Path) -> Path:
    """`run_dir`, emptied: each repetition starts from nothing."""
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    return run_dir


def pod_env(tree: Path = REPO) -> dict[str, str]:
    """Every pod's environment: `tree`'s trainer, one thread, and the trainer's two stores on ports
    outside the ephemeral range (as tests/trainer/_jobs.py run_job: MASTER_PORT+1/+2 collided)."""
    stores = free_port(span=2)
    return {
        **os.environ,
        "PYTHONPATH": str(tree),
        "OMP_NUM_THREADS": "1",
        "TRAINER_PG_PORT": str(stores),
        "TRAINER_INPROCESS_PORT": str(stores + 1),
    }


def run_job(
    specs: Sequence[PodSpec],
    *,
    host_port: int,
    timeout_s: float,
    backoff_limit: int,
    fail_job_exit_codes: Sequence[int] = (),
    replace_delay_s: float = 0.0,
    watch: Callable[[LocalJob], Callable[[], None]] | None = None,
) -> JobRun:
    """Start the pods as a Job (with its rendezvous service on `host_port`) and poll until it ends or
    `timeout_s` passes (then every pod is stopped and the result says so). `watch(job)` returns what to
    call at every poll: a scenario's outside action (bench.recovery_pods.Driver)."""
    load = os.getloadavg()[0]
    t0 = time.monotonic()
    with LocalJob(
        specs,
        backoff_limit=backoff_limit,
        fail_job_exit_codes=fail_job_exit_codes,
        replace_delay_s=replace_delay_s,
        host_port=host_port,
    ) as job:
        job.start()
        tick = watch(job) if watch is not None else None
        result: JobResult | None = None
        while result is None and time.monotonic() - t0 < timeout_s:
            if tick is not None:
                tick()
            result = job.poll()
            time.sleep(0.1)
        if result is None:
            result = job.wait(timeout_s=0.1)  # stops every pod and reports the timeout
        attempts = job.attempt(0) + 1
    return JobRun(result, time.monotonic() - t0, load, attempts)
