"""Checkpoints in the real command line (`python -m trainer`, 2 gloo ranks under torchrun), per mode.

The chart's default mode, nvrx, gets the full set here and the whole fault matrix elsewhere (every test
built on _jobs.RUN_VALUES); torch-async and sync one exact-resume run each (the suite must stay short on
2 cores). Exact resume: a run with a fault ends with the same sha256 of model and optimizer state as the
session's fault-free run (conftest `clean_run`: the pod command, nvrx), bit for bit.
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

from tests.helpers import REPO_ROOT, free_port
from tools.podcommand import with_options

pytestmark = pytest.mark.slow

STEPS, INTERVAL = 10, 3  # saves after steps 2, 5, 8 and, being the last, 9
JOB_TIMEOUT_S = 300


def _trainer(data: Path, out: Path, mode: str, *extra: str) -> list[str]:
    """The trainer's command; an option of `extra` replaces the same one here (the parser refuses repeats)."""
    return with_options([
        "-m", "trainer", f"--steps={STEPS}", f"--ckpt-interval={INTERVAL}", "--ckpt-keep=2",
        f"--ckpt-mode={mode}", f"--out-dir={out}", "--device=cpu", "--seed=11", "--no-inprocess",
        "--collective-timeout=30", "--inprocess-soft-timeout=60", "--inprocess-hard-timeout=90",
        "--inprocess-barrier-timeout=100", "--heartbeat-timeout=120",
        "--metrics-port=0", "--snapshot-interval=0",  # a local run (the defaults are the cluster's)
        "--", "--preset=tiny", f"--data-path={data}", "--seq-len=32", "--micro-batch-size=2",
    ], extra)  # fmt: skip


def _torchrun(max_restarts: int = 0) -> list[str]:
    exe = str(Path(sys.executable).with_name("torchrun"))
    return [exe, "--nnodes=1", "--nproc-per-node=2", "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{free_port()}", f"--max-restarts={max_restarts}",
            "--monitor-interval=0.2"]  # fmt: skip


def _run(argv: list[str], log: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT)}
    env.pop("RANK", None)
    with subprocess.Popen(argv, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, start_new_session=True) as proc:  # fmt: skip
        try:
            out, _ = proc.communicate(timeout=JOB_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            log.write_text(out)
            raise AssertionError(f"job did not finish in {JOB_TIMEOUT_S} s:\n{out[-4000:]}") from None
    log.write_text(out)
    return subprocess.CompletedProcess(argv, proc.returncode, out, "")


def _events(out: Path) -> list[dict[str, Any]]:
    evs = [
        json.loads(line)
        for p in sorted(out.glob("events.rank*.jsonl"))
        for line in p.read_text().splitlines()
    ]
    return sorted(evs, key=lambda e: float(e["t"]))


def _of(evs: list[dict[str, Any]], ev: str, **match: Any) -> list[dict[str, Any]]:
    return [e for e in evs if e["ev"] == ev and all(e.get(k) == v for k, v in match.items())]


def _completed_hash(out: Path, run: subprocess.CompletedProcess[str]) -> str:
    assert run.returncode == 0, run.stdout[-4000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["final_step"] == STEPS - 1, run.stdout[-4000:]
    (end,) = _of(_events(out), "run_end", rank=0, status="completed")
    return str(end["state_sha256"])


def test_the_last_step_is_committed_before_run_end(clean_run: tuple[Path, str]) -> None:
    out, digest = clean_run
    evs = _events(out)
    assert {e["mode"] for e in _of(evs, "ckpt_save")} == {"nvrx"}
    commits = [c["step"] for c in _of(evs, "ckpt_commit")]
    assert commits == [2, 5, 8, 9]  # 9: the last step, though 10 is no multiple of the interval
    kept = sorted(p.name for p in (out / "ckpt").iterdir() if p.is_dir())
    assert kept == ["step_00000005", "step_00000008", "step_00000009"]  # --ckpt-keep=3
    last_commit = _of(evs, "ckpt_commit", step=9)[0]["t"]
    assert all(e["t"] > last_commit for e in _of(evs, "run_end"))
    assert len(digest) == 64


@pytest.mark.parametrize("mode", ["torch-async", "sync"])
def test_exact_resume_after_a_worker_restart(
    token_file: Path, tmp_path: Path, clean_run: tuple[Path, str], mode: str
) -> None:
    out = tmp_path / "run"
    argv = [*_torchrun(max_restarts=1), *_trainer(token_file, out, mode, "--fault=sigkill:step=7:rank=0")]
    run = _run(argv, tmp_path / "job.log")
    digest = _completed_hash(out, run)
    evs = _events(out)
    assert _of(evs, "fault_injected", fault="sigkill") and _of(evs, "run_start", rank=0, restart=1)
    assert {r["step"] for r in _of(evs, "restore", restart=1)} & {2, 5}, "did not resume from a checkpoint"
    assert {e["mode"] for e in _of(evs, "ckpt_save")} == {mode}
    assert digest == clean_run[1]


def test_a_failed_write_is_reported_and_training_goes_on(
    token_file: Path, tmp_path: Path, clean_run: tuple[Path, str]
) -> None:
    out = tmp_path / "run"
    argv = [*_torchrun(), *_trainer(token_file, out, "nvrx", "--fault=ckpt-write-error:step=4:rank=1")]
    run = _run(argv, tmp_path / "job.log")
    digest = _completed_hash(out, run)  # no restart was allowed (max-restarts 0): it never stopped
    evs = _events(out)
    (failed,) = _of(evs, "ckpt_failed")
    assert failed["step"] == 5 and "injected ckpt-write-error" in failed["reason"]
    assert len(_of(evs, "run_start")) == 2  # one per rank: the failure restarted nothing
    assert [c["step"] for c in _of(evs, "ckpt_commit")] == [2, 8, 9]  # the next interval saved again
    summary = json.loads((out / "summary.json").read_text())
    assert summary["ckpt"]["failed"] == 1 and summary["ckpt"]["failures"][0]["step"] == 5
    assert digest == clean_run[1]


def test_no_loadable_checkpoint_stops_with_status_2_and_a_line_per_checkpoint(
    token_file: Path, tmp_path: Path
) -> None:
    out = tmp_path / "run"
    first = _run([sys.executable, *_trainer(token_file, out, "sync", "--steps=2")], tmp_path / "first.log")
    assert first.returncode == 0, first.stdout[-3000:]
    (ckpt,) = (out / "ckpt").glob("step_*")  # the last step (1), the only save of a 2-step run
    shard = max(ckpt.glob("*.distcp"), key=lambda p: p.stat().st_size)
    with open(shard, "r+b") as fh:
        fh.seek(shard.stat().st_size // 2)
        fh.write(b"\xff" * 16)

    again = _run([sys.executable, *_trainer(token_file, out, "sync")], tmp_path / "again.log")
    assert again.returncode == 2, again.stdout[-3000:]
    lines = [line for line in again.stdout.splitlines() if line.startswith("skipped checkpoint ")]
    assert lines == [f"skipped checkpoint {ckpt}: " + lines[0].split(": ", 1)[1]]
    assert "checksum mismatch" in lines[0]
    assert "ckpt_dir:" in again.stdout and "--allow-fresh-start" in again.stdout
    assert not _of(_events(out), "step", pid=_of(_events(out), "run_start")[-1]["pid"]), "it trained"

    # 4 steps: saves after steps 2 and 3, so --ckpt-keep=2 has a checkpoint too many to drop.
    fresh_argv = _trainer(token_file, out, "sync", "--allow-fresh-start", "--steps=4")
    fresh = _run([sys.executable, *fresh_argv], tmp_path / "fresh.log")
    assert fresh.returncode == 0, fresh.stdout[-3000:]
    assert {r["step"] for r in _of(_events(out), "restore")} == {-1}
    assert any("checksum mismatch" in s["reason"] for s in _of(_events(out), "ckpt_skipped"))
    assert ckpt.exists(), "retention deleted a checkpoint that failed to load"
