"""A team's own training function through the real command line (`python -m trainer --entrypoint=...`,
one CPU rank, no launcher): a tiny FSDP2 model, `SampleCursor`, an LR scheduler and an extra state entry
are checkpointed and resumed with the run; the arguments after `--` arrive as `job.args`; a function
that returns before `job.loop` ran its last step, or breaks a rule of the API, ends in one line."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import REPO_ROOT
from trainer.config.errors import EXIT_NO_RESTART

RUN_TIMEOUT_S = 240
TEAM = "team_loop_train"
SEED = 5
SAMPLES, BATCH = 40, 3

TEAM_SOURCE = f'''
"""A team's training function, as tests/trainer/api/test_job_loop.py runs it."""

import json

import torch
from torch import nn
from torch.distributed.fsdp import fully_shard

from trainer import api


class Counter:
    """An extra entry: counts the steps the function ran, across resumes."""

    def __init__(self):
        self.n = 0

    def state_dict(self):
        return {{"n": self.n}}

    def load_state_dict(self, state):
        self.n = int(state["n"])


class Journal:
    """An extra entry of dicts: each step's loss by step (it grows), and two fixed int-keyed slots."""

    def __init__(self):
        self.by_step, self.fixed, self.received = {{}}, {{0: 0.0, 1: 0.0}}, None

    def state_dict(self):
        return {{"by_step": dict(self.by_step), "fixed": dict(self.fixed)}}

    def load_state_dict(self, state):
        self.received = repr(state["fixed"])
        # Only the slots it has: a key of another type would make every later save fail.
        self.by_step, self.fixed = dict(state["by_step"]), {{k: state["fixed"][k] for k in (0, 1)}}


def build(job):
    torch.manual_seed(job.seed)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=job.mesh)
    fully_shard(model, mesh=job.mesh)
    optim = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(optim, lambda s: 1.0 / (1 + s))
    g = torch.Generator().manual_seed(0)
    dataset = [
        {{"id": torch.tensor(i), "x": torch.randn(4, generator=g), "y": torch.randn(1, generator=g)}}
        for i in range({SAMPLES})
    ]
    data = api.SampleCursor(dataset, batch_size={BATCH}, job=job)
    return model, optim, sched, data


def train(job: api.Job) -> None:
    model, optim, sched, data = build(job)
    counter, journal = Counter(), Journal()
    record = {{"args": list(job.args), "seed": job.seed, "steps": job.steps, "world": job.world_size,
              "attempt": job.attempt, "start_position": None, "start_counter": None, "batches": []}}
    for step, batch in job.loop(model=model, optimizer=optim, scheduler=sched, data=data,
                                state={{"counter": counter, "journal": journal}}):
        if record["start_position"] is None:
            record["start_position"] = data.position - {BATCH}  # this batch was drawn after the restore
            record["start_counter"] = counter.n
            record["start_by_step"] = dict(journal.by_step)
            record["received_fixed"] = journal.received
        loss = ((model(batch["x"]) - batch["y"]) ** 2).mean()
        loss.backward()
        optim.step()
        optim.zero_grad()
        sched.step()
        counter.n += 1
        journal.by_step[str(step)] = step + 0.5
        journal.fixed[0], journal.fixed[1] = step + 0.5, step * 2.0
        record["batches"].append([step, [int(i) for i in batch["id"]]])
        job.log(loss)
    record.update(counter=counter.n, last_epoch=sched.last_epoch, lr=sched.get_last_lr()[0],
                  finished=job.finished, entries=sorted(job.entries))
    (job.out_dir / f"team.{{job.steps}}.json").write_text(json.dumps(record))


def returns_early(job: api.Job) -> None:
    model, optim, sched, data = build(job)
    for step, _ in job.loop(model=model, optimizer=optim, data=data):
        if step == 1:
            break


def plain_data(job: api.Job) -> None:
    model, optim, _, _ = build(job)
    for _ in job.loop(model=model, optimizer=optim, data=[torch.zeros(4)] * 10):
        pass
'''


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("site")
    (root / f"{TEAM}.py").write_text(textwrap.dedent(TEAM_SOURCE))
    return root


def trainer(
    site: Path, out: Path, ckpt: Path, fn: str, *extra: str, steps: int = 4
) -> subprocess.CompletedProcess[str]:
    argv = [
        # No --data-path (nor any reference-model option): a team's function reads its own data.
        sys.executable, "-m", "trainer", f"--entrypoint={TEAM}:{fn}", f"--steps={steps}", "--ckpt-interval=2",
        "--ckpt-mode=sync", f"--ckpt-dir={ckpt}", "--device=cpu", f"--seed={SEED}", f"--out-dir={out}",
        # A local run: no metrics endpoint (the cluster's 9400 would linger for a scrape) and no snapshots
        # in the host's shared /dev/shm unless a test asks for them.
        "--metrics-port=0", "--snapshot-interval=0",
        *extra,
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(site), str(REPO_ROOT)]))
    with subprocess.Popen(argv, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, start_new_session=True) as proc:  # fmt: skip
        try:
            stdout, stderr = proc.communicate(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            stdout, stderr = proc.communicate()
            raise AssertionError(f"run did not finish in {RUN_TIMEOUT_S} s:\n{stderr[-4000:]}") from None
    return subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)


def events(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (out / "events.rank0.jsonl").read_text().splitlines()]


def of(evs: list[dict[str, Any]], ev: str) -> list[dict[str, Any]]:
    return [e for e in evs if e["ev"] == ev]


def expected_ids(steps: int) -> list[list[int]]:
    """The batches an uninterrupted cursor gives, one rank, the run's seed."""
    from trainer.api import SampleCursor

    cursor = SampleCursor(list(range(SAMPLES)), BATCH, seed=SEED, collate=list)
    return [next(cursor) for _ in range(steps)]


@pytest.fixture(scope="module")
def resumed(site: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two runs of `train` on one checkpoint directory: 4 steps (saves after steps 1 and 3), then the
    same run lengthened to 6 steps, which resumes after step 3. Their output: a/ and b/."""
    root = tmp_path_factory.mktemp("resumed")
    ckpt = root / "ckpt"
    first = trainer(site, root / "a", ckpt, "train", "--no-inprocess", "--", "--team-flag", "x")
    assert first.returncode == 0, first.stderr[-4000:]
    second = trainer(site, root / "b", ckpt, "train", "--no-inprocess", "--", "--other", steps=6)
    assert second.returncode == 0, second.stderr[-4000:]
    return root


@pytest.mark.slow
def test_team_function_trains_and_checkpoints(resumed: Path) -> None:
    out = resumed / "a"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 4 and summary["final_step"] == 3
    assert summary["ckpt"]["commits"] == 2  # after step 1 and after the last, step 3
    record = json.loads((out / "team.4.json").read_text())
    assert record["args"] == ["--team-flag", "x"]
    assert (record["seed"], record["steps"], record["world"], record["attempt"]) == (SEED, 4, 1, 0)
    assert record["entries"] == ["counter", "journal", "model", "optim", "scheduler", "trainer"]
    assert record["finished"] is True and record["counter"] == 4 and record["last_epoch"] == 4
    assert (record["start_position"], record["start_counter"]) == (0, 0)
    assert record["batches"] == [[s, ids] for s, ids in enumerate(expected_ids(4))]
    evs = events(out)
    steps = of(evs, "step")
    assert [e["step"] for e in steps] == [0, 1, 2, 3]
    assert all(isinstance(e["loss"], float) and e["loss"] == e["loss"] for e in steps)  # logged: not NaN
    assert [(e["step"], e["source"]) for e in of(evs, "restore")] == [(-1, "none")]  # nothing to restore
    assert not of(evs, "data_position_unsaved")


@pytest.mark.slow
def test_team_function_resumes_its_scheduler_data_and_state(resumed: Path) -> None:
    # The same checkpoints, two more steps: resumes after step 3 with the scheduler, the counter and the
    # data position of the first run, and the job's arguments of this one.
    out = resumed / "b"
    (restore,) = of(events(out), "restore")
    assert (restore["step"], restore["source"]) == (3, "fsx"), restore
    record = json.loads((out / "team.6.json").read_text())
    assert record["args"] == ["--other"]
    assert (record["start_position"], record["start_counter"]) == (4 * BATCH, 4)
    assert record["counter"] == 6 and record["last_epoch"] == 6
    assert record["lr"] == pytest.approx(0.1 / 7)
    assert record["batches"] == [[s, ids] for s, ids in enumerate(expected_ids(6)) if s >= 4]
    assert [e["step"] for e in of(events(out), "step")] == [4, 5]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["final_step"] == 5


@pytest.mark.slow
def test_a_state_entry_that_grows_comes_back_whole(resumed: Path) -> None:
    # job.loop accepted the entry (misuse.check_encodable: "what a snapshot and a checkpoint keep
    # exactly"): a dict that gains a key per step. The resume must hand back what was saved.
    record = json.loads((resumed / "b" / "team.6.json").read_text())
    assert record["start_by_step"] == {str(s): s + 0.5 for s in range(4)}


@pytest.mark.slow
def test_a_state_entry_with_int_keys_comes_back_whole(resumed: Path) -> None:
    # Fixed keys, ints: the values saved after step 3, under the same (int) keys.
    record = json.loads((resumed / "b" / "team.6.json").read_text())
    assert record["received_fixed"] == repr({0: 3.5, 1: 6.0})


def test_a_function_that_returns_before_the_last_step(site: Path, tmp_path: Path) -> None:
    run = trainer(site, tmp_path / "out", tmp_path / "ckpt", "returns_early", "--no-inprocess")
    # Without a launcher the worker still exits with the no-restart code (trainer/runtime/train.py
    # `_give_up`).
    assert run.returncode == EXIT_NO_RESTART, run.stderr[-4000:]
    lines = [line for line in run.stderr.splitlines() if line.startswith("config error:")]
    assert lines == [
        f"config error: entrypoint: {TEAM}:returns_early returned before job.loop ran its last step "
        "(1 of 4 steps done): iterate job.loop(...) to its end"
    ], run.stderr[-4000:]
    assert "Traceback" not in run.stderr
    evs = events(tmp_path / "out")
    assert [e["status"] for e in of(evs, "run_end")] == ["failed"]


def test_misuse_in_the_loop_is_not_retried_in_process(site: Path, tmp_path: Path) -> None:
    # Tier 1 on (the default): a Misuse is unrecoverable, so the Wrapper must not start another attempt.
    run = trainer(site, tmp_path / "out", tmp_path / "ckpt", "plain_data")
    assert run.returncode == EXIT_NO_RESTART, run.stderr[-4000:]
    lines = [line for line in run.stderr.splitlines() if line.startswith("config error:")]
    assert len(lines) == 1 and lines[0].startswith("config error: data: list cannot save its position"), (
        run.stderr[-4000:]
    )
    assert "allow_unsaved_data=True" in lines[0]
    evs = events(tmp_path / "out")
    assert len(of(evs, "run_start")) == 1 and not of(evs, "step")
