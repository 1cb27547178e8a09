"""Exact resume: faults of both tiers change nothing in the final model and optimizer state.

The reference is the session's fault-free run (conftest `clean_run`). The faulty run (conftest
`faulty_run`, which resilience/test_unrecoverable.py reads too), the same pod command (ft_launcher,
tier 1 on, the chart's nvrx checkpoints), takes an exception (recovered in-process) and later a SIGKILL
(recovered by ft_launcher restarting the workers); both resume from checkpoints and recompute steps.
Rank 0 hashes the full, unsharded model + optimizer state at the end (`state_sha256` of its `run_end`
event): the two hashes must be equal, bit for bit. (torch-async and sync: one exact-resume run each in
test_ckpt_modes.py.)

nvrx commits a save at a later step than it starts it, so each fault fires at the step right after a
save started (saves after steps 2, 5, 8, 9): at step 6 the newest committed checkpoint is usually step 2,
at step 9 step 5; each recovery is checked against the newest commit before its restore.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.trainer._jobs import assert_completed, newest_commit_before, of, read_events


@pytest.mark.slow
def test_faults_of_both_tiers_end_in_the_same_state_as_a_clean_run(
    faulty_run: tuple[Path, Path], clean_run: tuple[Path, str]
) -> None:
    faulty, faulty_log = faulty_run  # exception:step=6:rank=1, then sigkill:step=9:rank=0
    summary = assert_completed(faulty, faulty_log)
    evs = read_events(faulty)

    # Both tiers really acted: an in-process iteration in the first processes, then new processes.
    tiers = {f["type"]: f["tier"] for f in summary["faults"]}
    assert tiers == {"exception": 1, "sigkill": 2}, summary["faults"]
    assert of(evs, "run_start", rank=1, restart=0, iteration=1), "no in-process restart"
    assert of(evs, "run_start", rank=0, restart=1), "no launcher restart"
    # Each recovery went back to the newest committed checkpoint before it (a checkpoint, not a fresh
    # start; steps were recomputed, not skipped), and only these two recoveries happened.
    tier1 = newest_commit_before(evs, of(evs, "restore", rank=0, restart=0, iteration=1)[0]["t"])
    tier2 = newest_commit_before(evs, of(evs, "restore", rank=0, restart=1)[0]["t"])
    assert 2 <= tier1 < 6 and 2 <= tier2 < 9, (tier1, tier2)
    assert [(f["recovered"], f["restored_step"]) for f in summary["faults"]] == [(True, tier1), (True, tier2)]
    assert [(f["step"], f["steps_recomputed"]) for f in summary["faults"]] == [
        (6, 6 - tier1 - 1),
        (9, 9 - tier2 - 1),
    ]
    assert len(of(evs, "fault_detected", rank=0, tier=1)) == 1, of(evs, "fault_detected")
    # Tier 1 restarted both ranks in their own processes, from the same checkpoint (test_inprocess.py has
    # the same under torchrun in `make soak`).
    for rank in (0, 1):
        starts = of(evs, "run_start", rank=rank, restart=0)
        assert [e["iteration"] for e in starts] == [0, 1] and len({e["pid"] for e in starts}) == 1
        assert [r["step"] for r in of(evs, "restore", rank=rank, restart=0, iteration=1)] == [tier1]
    assert "InjectedFault" in of(evs, "fault_detected", rank=1, restart=0)[0]["reason"]
    # Tier 2 recovered the SIGKILL: the survivor reported it (its SIGTERM handler: tier 2) and the first
    # step after it ran in a new process (test_tier2.py kills rank 1 instead in `make soak`).
    t_kill = summary["faults"][1]["t"]
    assert any(d["tier"] == 2 for d in of(evs, "fault_detected", rank=1) if d["t"] >= t_kill)
    first = next(e for e in of(evs, "step") if e["t_start"] >= t_kill)
    assert first["step"] == tier2 + 1 and first["pid"] in {e["pid"] for e in of(evs, "run_start", restart=1)}
    # The shipped writer wrote every checkpoint.
    assert {e["mode"] for e in of(evs, "ckpt_save")} == {"nvrx"}

    (end,) = of(evs, "run_end", rank=0, status="completed")  # one: nothing restarted the finished run
    assert end["state_sha256"] == clean_run[1]


def test_state_hash_sees_every_bit_and_ignores_key_order() -> None:
    import hashlib

    import torch

    from trainer.digest.state_hash import hash_into

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
