"""The save dict a snapshot copies, kept within an attempt (trainer/state/plan.py), and the store's
one commit thread: reuse only while the live tensors stay put, and every snapshot exact either way.

One process, a plain model with AdamW (as in test_snapshot_store.py); a snapshot is checked
by restoring it into another state and comparing the full save dicts' digests (weights, optimizer state
and param groups, per-rank entries) with the live state's.
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch

from trainer.snapshot.config import SnapshotConfig
from trainer.snapshot.manager import Snapshots
from trainer.snapshot.store import SnapshotStore
from trainer.state import codec
from trainer.state.save_dict import apply_loaded, build_save_dict


class Counter:
    """A per-rank Stateful whose value changes every step (a per-rank entry of the save dict)."""

    def __init__(self) -> None:
        self.step = -1

    def state_dict(self) -> dict:
        return {"step": self.step, "pos": (self.step, 7)}

    def load_state_dict(self, sd: dict) -> None:
        self.step = int(sd["step"])


def make_state(seed: int = 0) -> dict:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return {"model": model, "optim": optim, "trainer": Counter()}


def train(state: dict, steps: int) -> None:
    model, optim = state["model"], state["optim"]
    for _ in range(steps):
        model(torch.randn(8, 16)).pow(2).mean().backward()
        optim.step()
        optim.zero_grad(set_to_none=True)
        state["trainer"].step += 1


def digest(state: dict) -> str:
    import hashlib

    from trainer.digest.state_hash import hash_into

    h = hashlib.sha256()
    hash_into(h, build_save_dict(state, 0))
    return h.hexdigest()


def restore_into(s: SnapshotStore, state: dict) -> None:
    (offer, *_), _ = s.offers()
    template = build_save_dict(state, 0)
    skeleton, tensors = codec.flatten(template)
    apply_loaded(state, s.load(offer, template, codec.layout_id(skeleton, codec.plan(tensors)[0])), 0)


def snapshots(tmp_path: Path) -> Snapshots:
    cfg = SnapshotConfig(interval_steps=1, dir=tmp_path / "shm", replication=False)
    return Snapshots(cfg, rank=0, world_size=1, fingerprint="run-a")


def restored_digest(snaps: Snapshots, *, scheduled: bool = False) -> str:
    """The digest of a fresh state after restoring the newest snapshot into it (`scheduled`: with a
    scheduler, whose initial_lr the param groups then carry)."""
    other = make_state(seed=1)
    if scheduled:
        torch.optim.lr_scheduler.LambdaLR(other["optim"], lambda s: 1.0)
    train(other, 1)  # its optimizer has state, like a live one
    assert snaps.store is not None
    restore_into(snaps.store, other)
    return digest(other)


def test_the_save_dict_is_reused_and_every_snapshot_is_exact(tmp_path: Path) -> None:
    """A scheduler changes lr every step: the kept param groups must carry the new value each time."""
    a = make_state()
    sched = torch.optim.lr_scheduler.LambdaLR(a["optim"], lambda s: 0.5**s)
    snaps = snapshots(tmp_path)
    for step in range(4):
        train(a, 1)
        sched.step()
        snaps.after_step(step, a)
        assert restored_digest(snaps, scheduled=True) == digest(a), (
            f"snapshot {step} differs from the live state"
        )
    assert snaps.plan.builds == 1  # built at the first snapshot, reused by the three others
    snaps.finish()


def test_a_parameter_whose_storage_changed_is_snapshotted_from_its_new_storage(tmp_path: Path) -> None:
    """`p.data = ...` keeps the parameter object but moves its values: the kept save dict still points
    at the old storage, so it must be built again (else the snapshot holds the old weights)."""
    a = make_state()
    snaps = snapshots(tmp_path)
    train(a, 1)
    snaps.after_step(0, a)
    weight = a["model"][0].weight
    with torch.no_grad():
        weight.data = torch.randn_like(weight) * 5
    train(a, 1)
    snaps.after_step(1, a)
    assert snaps.plan.builds == 2
    assert restored_digest(snaps) == digest(a)
    snaps.finish()


def test_replaced_optimizer_state_is_snapshotted(tmp_path: Path) -> None:
    """load_state_dict gives the optimizer new per-parameter state: built again, exact."""
    a = make_state()
    snaps = snapshots(tmp_path)
    train(a, 1)
    snaps.after_step(0, a)
    optim = a["optim"]
    saved = copy.deepcopy(optim.state_dict())
    for st in saved["state"].values():
        st["exp_avg"] = st["exp_avg"] + 1.0
    optim.load_state_dict(saved)
    snaps.after_step(1, a)
    assert snaps.plan.builds == 2
    assert restored_digest(snaps) == digest(a)
    snaps.finish()


def test_a_new_attempt_builds_afresh(tmp_path: Path) -> None:
    """Nothing of an attempt is reused by the next (its objects may be gone, their ids reused)."""
    a = make_state()
    snaps = snapshots(tmp_path)
    train(a, 1)
    snaps.after_step(0, a)
    snaps.plan.reset()  # what Snapshots.before_restore does at the start of each attempt
    train(a, 1)
    snaps.after_step(1, a)
    assert snaps.plan.builds == 2
    assert restored_digest(snaps) == digest(a)
    snaps.finish()


def test_commits_run_on_one_long_lived_thread(tmp_path: Path) -> None:
    """A thread per snapshot made the loop wait for each new thread to be scheduled (Thread.start)."""
    import threading

    a = make_state()
    snaps = snapshots(tmp_path)
    assert snaps.store is not None
    threads: list[threading.Thread] = []
    snaps.store.on_commit = lambda slot, step: threads.append(threading.current_thread())
    for step in range(3):
        train(a, 1)
        snaps.after_step(step, a)
        snaps.store.wait()
    assert len(threads) == 3 and len(set(threads)) == 1
    assert threads[0] is not threading.main_thread()
    snaps.finish()
    assert not threads[0].is_alive()  # closing the store ends it
