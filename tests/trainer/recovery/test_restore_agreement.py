"""The restore agreement's cost (trainer/recovery/restore.py): what a snapshot restore does not
pay for, and the one round it must keep.

- A snapshot newer than every rank's newest locally sealed step is restored after one all_gather and the
  confirming all_reduce: the node-local tier is neither read nor verified, nor agreed on in a second
  all_gather (before: every restore checksummed each rank's NVMe checkpoints first).
- A local step newer than the snapshot is still verified and wins.
- A rank that pulls its state from a peer's replica does so only after one more round, in which every
  holder learned the channel key (without it a pull could reach a holder before its key and be refused).
- A restore checksums the one slot it loads, not both (verifying both before the agreement would
  double a restore from memory); the newest slot is checked before the agreement, so a damaged one is
  never offered: reported (`restore_skipped`), quarantined, and the group agrees on the older one.
- A local (NVMe) step whose files fail their sealed digests is reported, its seal removed, and the
  durable checkpoint restored; the next restore does not meet it again.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from tests.trainer._ckpt import Events, make_state, snapshot, train_step
from trainer.checkpoint import CheckpointConfig, CheckpointLoop, CheckpointManager, local_tier
from trainer.recovery.restore import restore
from trainer.snapshot import store as store_module
from trainer.snapshot.store import HEADER_BYTES, SnapshotStore
from trainer.state.save_dict import build_save_dict

COLLECTIVES = (
    "all_gather",
    "all_reduce",
    "all_gather_object",
    "broadcast_object_list",
    "broadcast",
    "barrier",
)


@pytest.fixture
def counted(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Every collective the restore calls on torch.distributed, by name."""
    calls: Counter[str] = Counter()
    for name in COLLECTIVES:
        real = getattr(dist, name)

        def wrapped(*args: Any, _real: Any = real, _name: str = name, **kwargs: Any) -> Any:
            calls[_name] += 1
            return _real(*args, **kwargs)

        monkeypatch.setattr(dist, name, wrapped)
    return calls


@pytest.fixture
def verified(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The local tier's verifications (LocalTier.offers reads and checksums every sealed step)."""
    seen: list[str] = []
    real = local_tier.LocalTier.offers

    def offers(self: Any, fingerprint: str) -> Any:
        seen.append(fingerprint)
        return real(self, fingerprint)

    monkeypatch.setattr(local_tier.LocalTier, "offers", offers)
    return seen


def _ckpt(root: Path) -> tuple[CheckpointLoop, CheckpointConfig]:
    cfg = CheckpointConfig(dir=root / "ckpt", local_dir=root / "local", mode="sync", interval_steps=1)
    mgr = CheckpointManager(cfg, rank=0, world_size=1)
    return CheckpointLoop(mgr, cfg, Events(), rank=0, last_step=100), cfg


def _saved_then_snapshotted(
    root: Path, mesh: Any, *, saved: int, snapshotted: int | tuple[int, ...]
) -> dict[str, Any]:
    """Train to the last step named; a durable (and local) checkpoint of `saved`, a snapshot of each step
    in `snapshotted`; returns the state of each step."""
    snapshotted = snapshotted if isinstance(snapshotted, tuple) else (snapshotted,)
    state, ckpt_loop, store = make_state(mesh), _ckpt(root)[0], _store(root)
    states = {}
    try:
        for step in range(max(saved, *snapshotted) + 1):
            train_step(state, step)
            states[step] = snapshot(state)
            if step == saved:
                ckpt_loop.manager.save(step, state)
                ckpt_loop.manager.wait()
            if step in snapshotted:
                store.write(step, build_save_dict(state, 0))
                store.wait()
    finally:
        ckpt_loop.close()
        store.close()
    return states


def _store(root: Path) -> SnapshotStore:
    return SnapshotStore(root / "shm", rank=0, world_size=1, fingerprint="run")


def _restore(
    root: Path, mesh: Any, counted: Counter[str], peers: Any = None
) -> tuple[Any, dict[str, Any], list[dict[str, Any]]]:
    """(what restore returned, the restored state, the events it emitted)"""
    fresh, (ckpt_loop, _), store = make_state(mesh, seed=5), _ckpt(root), _store(root)
    counted.clear()  # the manager's own start (its lease's broadcast) is not the restore's
    try:
        got = restore(
            store, ckpt_loop, fresh, rank=0, device=torch.device("cpu"), events=ckpt_loop.events, peers=peers
        )
    finally:
        ckpt_loop.close()
        store.close()
    return got, fresh, ckpt_loop.events.seen


def test_a_snapshot_newer_than_the_local_tier_costs_one_all_gather_and_no_local_read(
    tmp_path: Path, one_rank: Any, counted: Counter[str], verified: list[str]
) -> None:
    states = _saved_then_snapshotted(tmp_path, one_rank, saved=1, snapshotted=2)
    assert (tmp_path / "local" / "step_00000001" / "rank0.json").is_file(), "the local tier holds step 1"
    got, fresh, seen = _restore(tmp_path, one_rank, counted)
    assert not [e for e in seen if e["ev"] == "restore_skipped"], "nothing was damaged"
    assert (got.step, got.source) == (2, "shm")
    assert all(torch.equal(a, b) for a, b in zip(snapshot(fresh).values(), states[2].values(), strict=True))
    assert verified == [], "the local tier was verified although the snapshot is newer"
    assert counted == Counter(all_gather=1, all_reduce=1), counted


def test_a_newer_local_step_is_verified_and_wins(
    tmp_path: Path, one_rank: Any, counted: Counter[str], verified: list[str]
) -> None:
    states = _saved_then_snapshotted(tmp_path, one_rank, saved=2, snapshotted=1)
    got, fresh, seen = _restore(tmp_path, one_rank, counted)
    assert not [e for e in seen if e["ev"] == "restore_skipped"], "nothing was damaged"
    assert (got.step, got.source) == (2, "local")
    assert all(torch.equal(a, b) for a, b in zip(snapshot(fresh).values(), states[2].values(), strict=True))
    assert len(verified) == 1


@pytest.fixture
def checksummed(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The payload bytes of every snapshot checksum computed (store.payload_checksum)."""
    sizes: list[int] = []
    real = store_module.payload_checksum

    def counting(buf: Any) -> str:
        sizes.append(len(buf))
        return real(buf)

    monkeypatch.setattr(store_module, "payload_checksum", counting)
    return sizes


def test_a_restore_checksums_only_the_slot_it_loads(
    tmp_path: Path, one_rank: Any, counted: Counter[str], checksummed: list[int]
) -> None:
    states = _saved_then_snapshotted(tmp_path, one_rank, saved=0, snapshotted=(1, 2))
    checksummed.clear()  # the writes' own commits
    got, fresh, seen = _restore(tmp_path, one_rank, counted)
    assert not [e for e in seen if e["ev"] == "restore_skipped"], "nothing was damaged"
    assert (got.step, got.source) == (2, "shm")
    assert all(torch.equal(a, b) for a, b in zip(snapshot(fresh).values(), states[2].values(), strict=True))
    assert len(checksummed) == 1, f"{len(checksummed)} payloads checksummed for one restore"


def test_a_newest_slot_that_fails_its_checksum_is_never_offered_and_the_older_one_wins(
    tmp_path: Path, one_rank: Any, counted: Counter[str], checksummed: list[int]
) -> None:
    states = _saved_then_snapshotted(tmp_path, one_rank, saved=0, snapshotted=(1, 2))
    reader = _store(tmp_path)
    (newest, older), _ = reader.offers()
    reader.close()
    assert (newest.header.step, older.header.step) == (2, 1)
    with open(tmp_path / "shm" / f"rank0.slot{newest.slot}", "r+b") as fh:  # one bit of a tensor flipped
        fh.seek(HEADER_BYTES + 64)
        byte = fh.read(1)
        fh.seek(HEADER_BYTES + 64)
        fh.write(bytes([byte[0] ^ 0x01]))
    checksummed.clear()
    got, fresh, seen = _restore(tmp_path, one_rank, counted)
    assert (got.step, got.source) == (1, "shm")
    assert all(torch.equal(a, b) for a, b in zip(snapshot(fresh).values(), states[1].values(), strict=True))
    refusal = [r for r in got.refused if "step 2" in r and "payload checksum mismatch" in r]
    assert refusal, got.refused
    assert len(checksummed) == 2 and counted["all_gather"] == 1 and counted["all_reduce"] == 1, counted
    skipped = [e for e in seen if e["ev"] == "restore_skipped"]
    assert [(e["source"], e["step"]) for e in skipped] == [("shm", 2)], skipped
    # quarantined: a second restore meets neither the damage nor its checksum again
    checksummed.clear()
    again, _, seen_again = _restore(tmp_path, one_rank, counted)
    assert not [e for e in seen_again if e["ev"] == "restore_skipped"], "met twice"
    assert (again.step, again.source) == (1, "shm") and len(checksummed) == 1
    assert not any("checksum" in r for r in again.refused), again.refused


def test_a_local_step_that_fails_its_sealed_digest_is_skipped_once_and_the_durable_one_wins(
    tmp_path: Path, one_rank: Any, counted: Counter[str]
) -> None:
    states = _saved_then_snapshotted(tmp_path, one_rank, saved=2, snapshotted=1)
    (shard,) = (tmp_path / "local" / "step_00000002").glob("__0_*.distcp")
    _flip_byte(shard, shard.stat().st_size // 2)
    got, fresh, seen = _restore(tmp_path, one_rank, counted)
    assert (got.step, got.source) == (2, "fsx")
    assert all(torch.equal(a, b) for a, b in zip(snapshot(fresh).values(), states[2].values(), strict=True))
    skipped = [e for e in seen if e["ev"] == "restore_skipped"]
    assert [(e["source"], e["step"]) for e in skipped] == [("local", 2)], skipped
    assert "checksum mismatch" in skipped[0]["reason"]
    again, _, seen_again = _restore(tmp_path, one_rank, counted)
    assert (again.step, again.source) == (2, "fsx")
    assert [e for e in seen_again if e["ev"] == "restore_skipped"] == [], "met twice"


def _flip_byte(path: Path, at: int) -> None:
    with open(path, "r+b") as fh:
        fh.seek(at)
        byte = fh.read(1)
        fh.seek(at)
        fh.write(bytes([byte[0] ^ 0x01]))


class FakePeers:
    """A peer holds this rank's replica of step 3 (its own slots are empty): `fetch` records how many
    all_reduces had run when it was called, and fails (the restore then falls back)."""

    def __init__(self, counted: Counter[str]) -> None:
        self.counted = counted
        self.fetched_after: list[int] = []
        self.restored: list[int] = []

    def offer_row(self) -> list[int]:
        return [7]

    def learn(self, rows: list[list[int]]) -> list[set[int]]:
        assert rows == [[7]]
        return [{3}]

    def fetch(self, step: int) -> str:
        self.fetched_after.append(self.counted["all_reduce"])
        return "holder gone"

    def holds(self, step: int) -> bool:
        return step == 3

    def after_restore(self, step: int) -> None:
        self.restored.append(step)


def test_a_pull_from_a_peer_waits_for_one_round_in_which_every_holder_learned_the_key(
    tmp_path: Path, one_rank: Any, counted: Counter[str]
) -> None:
    peers = FakePeers(counted)
    with pytest.raises(RuntimeError, match="no checkpoint exists"):  # the pull failed, nothing to fall to
        _restore(tmp_path, one_rank, counted, peers)
    assert peers.fetched_after == [1], "the pull must come after the keying round (one all_reduce)"
    assert counted["all_gather"] == 1


def test_a_filled_template_skips_the_models_reload_and_a_copy_does_not(
    one_rank: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trainer.state import save_dict as state_module

    source = make_state(one_rank)
    train_step(source, 0)
    saved = build_save_dict(source, 0)
    reloads: list[str] = []
    real = state_module.set_state_dict
    monkeypatch.setattr(
        state_module, "set_state_dict", lambda *a, **k: (reloads.append("all"), real(*a, **k))
    )
    for copied in (False, True):
        target = make_state(one_rank, seed=5)
        template = build_save_dict(target, 0)
        if copied:  # tensors that are not the model's own: only a full reload puts them there
            template = {**template, "model": {k: v.detach().clone() for k, v in template["model"].items()}}
        for mine, theirs in zip(template["model"].values(), saved["model"].values(), strict=True):
            mine.to_local().copy_(theirs.to_local())  # what codec.fill does
        template["optim"] = saved["optim"]  # the optimizer goes through its own load either way
        template["trainer@rank0"] = saved["trainer@rank0"]
        reloads.clear()
        state_module.apply_filled(target, template, 0)
        assert reloads == (["all"] if copied else []), copied
        assert all(
            torch.equal(a, b)
            for a, b in zip(snapshot(target).values(), snapshot(source).values(), strict=True)
        )
        assert target["trainer"].step == source["trainer"].step
