"""One owner per checkpoint directory (trainer/checkpoint/lease.py): a second live job on a claimed
directory stops before training with one line naming the first, whose checkpoints stay untouched; a
stale lease is taken over; a run whose checkpoint directory was deleted never restores the old NVMe steps
(they are pruned); retention never deletes another lineage's checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.trainer._ckpt import SMALL, Counter, Events
from tests.trainer._jobs import log_tail, run_job, torchrun, trainer_args
from trainer.checkpoint import CheckpointConfig, CheckpointLoop, CheckpointManager, layout
from trainer.checkpoint import lease as lease_mod
from trainer.checkpoint.lease import Lease
from trainer.config.errors import UnrecoverableError
from trainer.reference.model import build_model


def _state(mesh: Any, seed: int = 0) -> dict[str, Any]:
    model = build_model(SMALL, mesh=mesh, device=torch.device("cpu"), seed=seed)
    return {"model": model, "optim": torch.optim.AdamW(model.parameters(), lr=1e-2), "trainer": Counter()}


def _tree_digest(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file() and p.name != lease_mod.LEASE
    }


def test_a_live_lease_refuses_another_job_and_a_stale_one_is_taken_over(tmp_path: Path, caplog) -> None:  # type: ignore[no-untyped-def]
    first = Lease(tmp_path, "job-a")
    first.claim()
    lineage = first.lineage
    Lease(tmp_path, "job-a").claim()  # a restart of the same job: its own lease
    with pytest.raises(
        UnrecoverableError, match=r"^ckpt_dir: .* is in use by job 'job-a' \(host .*heartbeat 0 s ago\)"
    ):
        Lease(tmp_path, "job-b").claim()
    held = json.loads((tmp_path / lease_mod.LEASE).read_text())
    held.update(heartbeat=time.time() - 3600, host="another-host")
    (tmp_path / lease_mod.LEASE).write_text(json.dumps(held))
    second = Lease(tmp_path, "job-b")
    second.claim()
    assert second.lineage == lineage, "a takeover inherits the directory's checkpoints"
    assert "taking over the lease of job 'job-a' (heartbeat 3600 s ago)" in caplog.text
    assert json.loads((tmp_path / lease_mod.LEASE).read_text())["job"] == "job-b"
    # a lease whose process on this host is gone is stale at once
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    held = json.loads((tmp_path / lease_mod.LEASE).read_text())
    held.update(pid=int(dead.stdout))
    (tmp_path / lease_mod.LEASE).write_text(json.dumps(held))
    Lease(tmp_path, "job-c").claim()
    # a fresh directory gets a lineage of its own
    fresh = Lease(tmp_path / "new", "job-a")
    fresh.claim()
    assert fresh.lineage != lineage


def test_a_refused_claim_starts_no_checkpoint_writer(
    one_rank: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The claim comes before the writers: a job that stops on it has spawned no NVRx worker or
    write-results Manager for its exit to wait on (a refused job once outlived a 120 s timeout so)."""
    from trainer.checkpoint import saver as saver_mod

    Lease(tmp_path / "ckpt", "job-a").claim()  # live: this process, this host, a fresh heartbeat

    def no_writer_yet(mode: str, *args: Any, **kwargs: Any) -> None:
        raise AssertionError(f"a {mode} writer was built before the claim was settled")

    monkeypatch.setattr(saver_mod, "make_backend", no_writer_yet)
    monkeypatch.setenv("JOB_ID", "job-b")
    with pytest.raises(UnrecoverableError, match=r"^ckpt_dir: .* is in use by job 'job-a'"):
        CheckpointManager(CheckpointConfig(dir=tmp_path / "ckpt", mode="nvrx"), rank=0, world_size=1)


def test_a_second_job_on_a_claimed_directory_stops_with_one_line(
    one_rank: Any, token_file: Path, tmp_path: Path
) -> None:
    """Job A is this process: it committed step 2 into out/ckpt and holds the lease (heartbeat running).
    Job B is the real trainer (torchrun, 2 ranks) on the same directory."""
    out = tmp_path / "run"
    cfg = CheckpointConfig(dir=out / "ckpt", mode="sync", interval_steps=1)
    manager = CheckpointManager(cfg, rank=0, world_size=1)
    loop = CheckpointLoop(manager, cfg, Events(), rank=0, last_step=10)
    loop.after_step(2, _state(one_rank))
    before = _tree_digest(out / "ckpt")
    assert "step_00000002/MANIFEST.json" in before
    try:
        log = tmp_path / "job-b.log"
        code = run_job([*torchrun(), *trainer_args(token_file, out)], log, timeout_s=120)
        text = log.read_text()
        assert code != 0, log_tail(log)
        line = f"is in use by job {manager.lease.job!r}"
        assert line in text, log_tail(log)
        recorded = json.loads((out / "unrecoverable.json").read_text())
        assert recorded["line"].startswith("config error: ckpt_dir: ") and line in recorded["line"], recorded
        assert "\n" not in recorded["line"]
        evs = [json.loads(x) for p in out.glob("events*.jsonl") for x in p.read_text().splitlines() if x]
        assert not [e for e in evs if e.get("ev") == "step"], "job B trained"
        assert _tree_digest(out / "ckpt") == before, "job B touched job A's checkpoints"
        assert json.loads((out / "ckpt" / lease_mod.LEASE).read_text())["job"] == manager.lease.job
    finally:
        loop.close()


def test_a_run_whose_checkpoint_directory_was_deleted_never_restores_old_nvme_steps(
    one_rank: Any, tmp_path: Path
) -> None:
    from trainer.recovery.restore import restore

    cfg = CheckpointConfig(dir=tmp_path / "fsx" / "run", mode="sync", interval_steps=1,
                           local_dir=tmp_path / "nvme" / "run")  # fmt: skip
    manager = CheckpointManager(cfg, rank=0, world_size=1)
    loop = CheckpointLoop(manager, cfg, Events(), rank=0, last_step=10)
    loop.after_step(4, _state(one_rank))
    loop.manager.wait()
    assert (cfg.local_dir / layout.committed_name(4) / "rank0.json").is_file()
    loop.close()
    # the same run restarts: it restores step 4 from the node (same lineage)
    loop = CheckpointLoop(CheckpointManager(cfg, rank=0, world_size=1), cfg, Events(), rank=0, last_step=10)
    assert (
        restore(
            None, loop, _state(one_rank, seed=3), rank=0, device=torch.device("cpu"), events=Events()
        ).source
        == "local"
    )
    loop.close()

    shutil.rmtree(cfg.dir)  # the team deleted the run's checkpoint directory; the node's NVMe kept its steps
    events = Events()
    loop = CheckpointLoop(CheckpointManager(cfg, rank=0, world_size=1), cfg, events, rank=0, last_step=10)
    restored = restore(
        None, loop, _state(one_rank, seed=3), rank=0, device=torch.device("cpu"), events=events
    )
    assert (restored.step, restored.source) == (-1, "none"), restored
    assert not (cfg.local_dir / layout.committed_name(4)).exists(), "the old run's NVMe step was not pruned"
    loop.close()


def test_retention_never_deletes_another_lineages_checkpoint(one_rank: Any, tmp_path: Path) -> None:
    cfg = CheckpointConfig(dir=tmp_path / "ckpt", mode="sync", interval_steps=1, keep_latest=1)
    loop = CheckpointLoop(CheckpointManager(cfg, rank=0, world_size=1), cfg, Events(), rank=0, last_step=10)
    state = _state(one_rank)
    loop.after_step(1, state)
    loop.close()
    (cfg.dir / lease_mod.LEASE).unlink()  # another run starts on the directory (a new lineage)
    loop = CheckpointLoop(CheckpointManager(cfg, rank=0, world_size=1), cfg, Events(), rank=0, last_step=10)
    loop.after_step(2, state)
    loop.after_step(3, state)
    loop.close()
    names = sorted(p.name for p in cfg.dir.glob("step_*"))
    assert names == ["step_00000001", "step_00000003"], names  # 2 was this lineage's, 1 the other's
    assert os.path.exists(cfg.dir / "step_00000001" / layout.MANIFEST)
