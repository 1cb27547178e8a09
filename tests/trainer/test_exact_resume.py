"""Exact resume: faults of both tiers change nothing in the final model and optimizer state.

Run A has no faults. Run B, under ft_launcher with tier 1 on, takes an exception (recovered in-process)
and later a SIGKILL (recovered by ft_launcher restarting the workers); both resume from checkpoints and
recompute steps. Rank 0 hashes the full, unsharded model + optimizer state at the end (`state_sha256`
of its `run_end` event): the two hashes must be equal, bit for bit.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.trainer._jobs import (
    assert_completed,
    log_tail,
    of,
    pod_command,
    read_events,
    run_job,
)


def _final_hash(out: Path) -> str:
    (end,) = of(read_events(out), "run_end", rank=0, status="completed")
    return str(end["state_sha256"])


@pytest.mark.slow
def test_faults_of_both_tiers_end_in_the_same_state_as_a_clean_run(tmp_path: Path, token_file: Path) -> None:
    clean, clean_log = tmp_path / "clean", tmp_path / "clean.log"
    assert run_job(pod_command(token_file, clean), clean_log) == 0, log_tail(clean_log)
    assert_completed(clean, clean_log)
    assert not of(read_events(clean), "fault_injected")

    faulty, faulty_log = tmp_path / "faulty", tmp_path / "faulty.log"
    faults = ["--fault=exception:step=4:rank=1", "--fault=sigkill:step=7:rank=0"]
    assert run_job(pod_command(token_file, faulty, *faults), faulty_log) == 0, log_tail(faulty_log)
    summary = assert_completed(faulty, faulty_log)
    evs = read_events(faulty)

    # Both tiers really acted: an in-process iteration in the first processes, then new processes.
    tiers = {f["type"]: f["tier"] for f in summary["faults"]}
    assert tiers == {"exception": 1, "sigkill": 2}, summary["faults"]
    assert of(evs, "run_start", rank=1, restart=0, iteration=1), "no in-process restart"
    assert of(evs, "run_start", rank=0, restart=1), "no launcher restart"
    # Each recovery went back to the checkpoint before its fault (steps were recomputed, not skipped).
    assert [(f["recovered"], f["restored_step"]) for f in summary["faults"]] == [(True, 2), (True, 5)]

    digest = _final_hash(clean)
    assert len(digest) == 64
    assert _final_hash(faulty) == digest


def test_state_hash_sees_every_bit_and_ignores_key_order() -> None:
    import hashlib

    import torch

    from trainer.state_hash import hash_into

    def digest(state: dict) -> str:
        h = hashlib.sha256()
        hash_into(h, state)
        return h.hexdigest()

    base = {
        "model": {"w": torch.arange(6.0).reshape(2, 3)},
        "optim": {"state": {"w": {"step": torch.tensor(3.0)}}},
    }
    same = {
        "optim": {"state": {"w": {"step": torch.tensor(3.0)}}},
        "model": {"w": torch.arange(6.0).reshape(2, 3)},
    }
    assert digest(base) == digest(same)
    flipped = {
        "model": {"w": torch.arange(6.0).reshape(2, 3)},
        "optim": {"state": {"w": {"step": torch.tensor(3.0)}}},
    }
    flipped["model"]["w"].view(torch.int32)[1, 2] ^= 1  # one bit of one float
    assert digest(flipped) != digest(base)
    reshaped = {"model": {"w": torch.arange(6.0).reshape(3, 2)}, "optim": base["optim"]}
    assert digest(reshaped) != digest(base)
