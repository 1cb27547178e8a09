"""Exit 93 fails the Job at once: NVRx 0.7's progress tracker stops restarting a worker group that makes no
progress, ft_launcher exits with --ft-no-restart-exit-code, and the Job's FailJob rule ends the run
without replacing the pod (tools/localpods.LocalJob plays the Job controller with the chart's codes).

The workers fail the same way on every start (the data file is missing), and the checkpoint iteration file
the trainer writes at each commit already says step 5: every cycle after the first makes no progress.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT, free_port
from tools.localpods import LocalJob, PodSpec
from trainer.config.errors import EXIT_CONFIG, EXIT_NO_RESTART
from trainer.resilience.progress import ITERATION_FILE, write_iteration_file

MAX_NO_PROGRESS_CYCLES = 2


@pytest.mark.slow
def test_no_progress_across_restarts_exits_93_and_fails_the_job_at_once(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    iteration_file = write_iteration_file(ckpt, 5)
    assert iteration_file.name == ITERATION_FILE and iteration_file.read_text() == "5\n"
    port = free_port()
    argv = [
        str(Path(sys.executable).with_name("ft_launcher")),
        "--nnodes=1:1",
        "--nproc-per-node=1",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        "--rdzv-id=no-restart-test",
        "--ft-rdzv-impl=barrier",
        "--max-restarts=20",  # far more than the progress tracker allows
        "--monitor-interval=0.3",
        "--ft-restart-policy=any-failed",
        f"--ft-no-restart-exit-code={EXIT_NO_RESTART}",
        f"--ft-max-no-progress-cycles={MAX_NO_PROGRESS_CYCLES}",
        f"--ft-checkpoint-iteration-file={iteration_file}",
        "-m",
        "trainer",
        f"--ckpt-dir={ckpt}",
        f"--out-dir={tmp_path / 'run'}",
        "--device=cpu",
        "--",
        f"--data-path={tmp_path / 'missing.npy'}",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT)}
    log = tmp_path / "pod-0.log"
    job = LocalJob(
        [PodSpec("pod-0", argv, env, log)],
        backoff_limit=3,
        fail_job_exit_codes=(EXIT_CONFIG, EXIT_NO_RESTART),
    )
    with job:
        started = time.monotonic()
        job.start()
        result = job.wait(timeout_s=180)
        took = time.monotonic() - started
    text = log.read_text()
    assert not result.succeeded and "FailJob" in result.reason, result.reason + text[-3000:]
    (exit_,) = result.exits
    assert (exit_.returncode, exit_.reason) == (EXIT_NO_RESTART, "fail-job"), text[-3000:]
    assert result.attempts(0) == 1  # the pod was not replaced
    # The tracker stopped it after the allowed cycles without progress, not after --max-restarts.
    assert "made NO progress" in text and "No more restarts will be attempted" in text
    assert text.count("starting workers for entrypoint") <= MAX_NO_PROGRESS_CYCLES + 1
    assert took < 120, f"took {took:.0f} s"
