"""Snapshot store (trainer/snapshot/store.py): round trip, double buffering, checksums, refusals.

One process, a plain model with AdamW: the store only sees a checkpoint save dict (FSDP2 shards are
plain local tensors to it; tests/trainer/recovery/test_restore_dist.py covers the sharded case).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
import torch

from trainer.config.errors import UnrecoverableError
from trainer.snapshot import store as store_module
from trainer.snapshot.budget import check_fits
from trainer.snapshot.store import HEADER_BYTES, SnapshotStore
from trainer.state import codec
from trainer.state.save_dict import apply_loaded, build_save_dict


class Counter:
    """A Stateful with a tuple, a nested dict and a tensor, like the trainer's state."""

    def __init__(self) -> None:
        self.step, self.rng = -1, torch.zeros(8, dtype=torch.uint8)

    def state_dict(self) -> dict:
        return {"step": self.step, "data": {"pos": (self.step, 7), "name": "x"}, "rng": self.rng.clone()}

    def load_state_dict(self, sd: dict) -> None:
        assert sd["data"]["pos"] == (int(sd["step"]), 7) and isinstance(sd["data"]["pos"], tuple)
        self.step, self.rng = int(sd["step"]), sd["rng"].clone()


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
        state["trainer"].rng = torch.randint(0, 255, (8,), dtype=torch.uint8)


def digest(state: dict) -> str:
    from trainer.digest.state_hash import hash_into

    h = hashlib.sha256()
    sd = build_save_dict(state, 0)
    hash_into(h, sd)
    return h.hexdigest()


def store(tmp_path: Path, **kw: object) -> SnapshotStore:
    args = {"rank": 0, "world_size": 1, "fingerprint": "run-a", **kw}
    return SnapshotStore(tmp_path / "shm", **args)  # type: ignore[arg-type]


def restore_into(s: SnapshotStore, state: dict) -> int:
    (offer, *_), _ = s.offers()
    template = build_save_dict(state, 0)
    skeleton, tensors = codec.flatten(template)
    loaded = s.load(offer, template, codec.layout_id(skeleton, codec.plan(tensors)[0]))
    apply_loaded(state, loaded, 0)
    return offer.header.step


def test_round_trip_restores_every_bit(tmp_path: Path) -> None:
    a = make_state()
    train(a, 3)
    s = store(tmp_path)
    result = s.write(a["trainer"].step, build_save_dict(a, 0))
    assert result.bytes > 0 and result.blocked_s >= result.copy_s
    b = make_state(seed=1)  # other weights, no optimizer state yet
    assert digest(b) != digest(a)
    assert restore_into(s, b) == 2
    assert digest(b) == digest(a)
    assert b["trainer"].step == 2 and torch.equal(b["trainer"].rng, a["trainer"].rng)
    # and training on from the restored state stays identical
    torch.manual_seed(5)
    train(a, 2)
    torch.manual_seed(5)
    train(b, 2)
    assert digest(b) == digest(a)


def test_a_crash_mid_copy_keeps_the_previous_snapshot(tmp_path: Path) -> None:
    a = make_state()
    train(a, 1)
    s = store(tmp_path)
    s.write(0, build_save_dict(a, 0))
    at_step0 = digest(a)
    train(a, 1)
    s.write(1, build_save_dict(a, 0))
    train(a, 1)
    with pytest.raises(RuntimeError, match="injected crash"):
        s.write(2, build_save_dict(a, 0), crash_after_bytes=1000)
    offers, rejected = s.offers()
    # step 2 went to the slot of step 0 (never to the newest): step 1 survives whole
    assert [o.header.step for o in offers] == [1]
    assert [r.reason for r in rejected] == ["incomplete (a write was interrupted)"]
    # and a new process (another store object on the same files) sees the same
    offers2, _ = store(tmp_path).offers()
    assert [o.header.step for o in offers2] == [1] and not offers2[0].written_here
    assert offers[0].written_here
    b = make_state(seed=3)
    assert restore_into(s, b) == 1
    assert digest(b) != at_step0


def test_a_flipped_byte_is_detected_and_the_other_slot_offered(tmp_path: Path) -> None:
    a = make_state()
    train(a, 1)
    s = store(tmp_path)
    s.write(0, build_save_dict(a, 0))
    train(a, 1)
    s.write(1, build_save_dict(a, 0))
    s.close()
    newest = tmp_path / "shm" / "rank0.slot1"
    with open(newest, "r+b") as fh:
        fh.seek(HEADER_BYTES + 100)
        byte = fh.read(1)
        fh.seek(HEADER_BYTES + 100)
        fh.write(bytes([byte[0] ^ 0x01]))
    offers, rejected = store(tmp_path).offers()
    assert [o.header.step for o in offers] == [0]
    assert [(r.slot, r.reason) for r in rejected] == [(1, "payload checksum mismatch")]


def _load(s: SnapshotStore, offer: object, state: dict) -> dict:
    template = build_save_dict(state, 0)
    skeleton, tensors = codec.flatten(template)
    return s.load(offer, template, codec.layout_id(skeleton, codec.plan(tensors)[0]))  # type: ignore[arg-type]


def _flip(path: Path, at: int) -> None:
    with open(path, "r+b") as fh:
        fh.seek(at)
        byte = fh.read(1)
        fh.seek(at)
        fh.write(bytes([byte[0] ^ 0x01]))


def test_a_load_checks_the_payload_its_own_processes_slot_included(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checked: list[int] = []
    real = store_module.payload_checksum
    monkeypatch.setattr(store_module, "payload_checksum", lambda buf: checked.append(len(buf)) or real(buf))
    a = make_state()
    train(a, 1)
    s = store(tmp_path)
    s.write(0, build_save_dict(a, 0))
    s.wait()
    checked.clear()
    # this process's own slot (tier 1): checked once by the load
    (own,), _ = s.offers(verify_payload=False)
    assert own.written_here and not own.payload_verified
    b = make_state(seed=1)
    apply_loaded(b, _load(s, own, b), 0)
    assert digest(b) == digest(a) and len(checked) == 1
    # the same slot seen by another process's store (tier 2): checked by the load, once
    (theirs,), _ = store(tmp_path).offers(verify_payload=False)
    assert not theirs.written_here
    c = make_state(seed=2)
    apply_loaded(c, _load(store(tmp_path), theirs, c), 0)
    assert digest(c) == digest(a) and len(checked) == 2


@pytest.mark.parametrize("reader", ["own", "other"])
def test_a_flipped_bit_is_refused_before_a_byte_is_copied_and_the_slot_quarantined(
    tmp_path: Path, reader: str
) -> None:
    a = make_state()
    train(a, 1)
    s = store(tmp_path)
    s.write(0, build_save_dict(a, 0))
    s.wait()
    _flip(tmp_path / "shm" / "rank0.slot0", HEADER_BYTES + 100)  # damaged at rest, header whole
    r = s if reader == "own" else store(tmp_path)
    (flipped,), _ = r.offers(verify_payload=False)
    assert flipped.written_here == (reader == "own")
    d = make_state(seed=3)
    before = digest(d)
    with pytest.raises(store_module.CorruptCopy, match="payload checksum mismatch"):
        _load(r, flipped, d)
    assert digest(d) == before, "bytes of a damaged copy reached the state"
    # quarantined: the next restore (this process or the next) finds no copy, and no damage to report
    for later in (r, store(tmp_path)):
        offers, rejected = later.offers()
        assert offers == [] and [x.corrupt for x in rejected] == [False], rejected


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        ("payload", "payload checksum mismatch"),
        ("header", "header checksum mismatch"),
        ("truncated", "payload truncated"),
    ],
)
def test_each_kind_of_damage_is_refused_as_corrupt_and_quarantined(
    tmp_path: Path, damage: str, why: str
) -> None:
    a = make_state()
    train(a, 1)
    s = store(tmp_path)
    s.write(4, build_save_dict(a, 0))
    s.close()
    path = tmp_path / "shm" / "rank0.slot0"
    if damage == "payload":
        _flip(path, path.stat().st_size - 10)  # the skeleton's last bytes: the payload's digest covers it
    elif damage == "header":
        _flip(path, 20)  # inside the header's JSON: its own CRC no longer matches
    else:
        os.truncate(path, path.stat().st_size - 1)
    offers, rejected = store(tmp_path).offers()
    assert offers == [] and len(rejected) == 1 and why in rejected[0].reason, rejected
    assert rejected[0].corrupt and rejected[0].step == (-1 if damage == "header" else 4), rejected
    again, rejected = store(tmp_path).offers()
    assert again == [] and not rejected[0].corrupt, "a quarantined copy was met again as a fresh fault"


def test_snapshots_of_another_run_world_size_or_rank_are_refused(tmp_path: Path) -> None:
    a = make_state()
    train(a, 1)
    s = store(tmp_path)
    s.write(0, build_save_dict(a, 0))
    s.close()
    for kw, why in [
        ({"fingerprint": "run-b"}, "another run"),
        ({"world_size": 2}, "world size 1, this run has 2"),
    ]:
        offers, rejected = store(tmp_path, **kw).offers()
        assert offers == [] and len(rejected) == 1 and why in rejected[0].reason, rejected
    # rank 1 reading rank 0's file (a renamed or copied file)
    os.rename(tmp_path / "shm" / "rank0.slot0", tmp_path / "shm" / "rank1.slot0")
    offers, rejected = store(tmp_path, rank=1).offers()
    assert offers == [] and "rank 0's snapshot" in rejected[0].reason


def test_a_different_layout_is_refused_at_load(tmp_path: Path) -> None:
    a = make_state()
    train(a, 1)
    s = store(tmp_path)
    s.write(0, build_save_dict(a, 0))
    (offer,), _ = s.offers()
    bigger = {"model": torch.nn.Linear(16, 64), "trainer": Counter()}
    template = build_save_dict(bigger, 0)
    skeleton, tensors = codec.flatten(template)
    with pytest.raises(ValueError, match="layout"):
        s.load(offer, template, codec.layout_id(skeleton, codec.plan(tensors)[0]))


def test_discard_newer_than_invalidates_later_slots(tmp_path: Path) -> None:
    a = make_state()
    train(a, 1)
    s = store(tmp_path)
    s.write(0, build_save_dict(a, 0))
    s.write(1, build_save_dict(a, 0))
    s.discard_newer_than(0)
    assert [o.header.step for o in s.offers()[0]] == [0]
    s.remove()
    assert list((tmp_path / "shm").iterdir()) == []


def test_budget_names_the_field_when_shm_is_too_small(tmp_path: Path) -> None:
    free = os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize
    assert check_fits(tmp_path, 1 << 20, local_ranks=8) == 16 << 20
    with pytest.raises(UnrecoverableError, match=r"^snapshot_dir: .* MiB free, snapshots need .*shmSize"):
        check_fits(tmp_path, free, local_ranks=1)


def test_budget_skips_a_slot_file_another_rank_removes_while_it_counts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slot file listed, seen to be a file, and gone before its size is read (the pod's other rank
    replaced its replica meanwhile): counted as absent, not a FileNotFoundError in the training loop."""
    (tmp_path / "replicas").mkdir()
    kept = tmp_path / "rank0.slot0"
    kept.write_bytes(b"x" * 4096)
    gone = tmp_path / "replicas" / "rank2.slot1"  # never created: removed right after the listing
    real_glob = Path.glob

    def glob(self: Path, pattern: str):  # type: ignore[no-untyped-def]
        found = list(real_glob(self, pattern))
        return [*found, gone] if pattern.startswith("replicas/") else found

    monkeypatch.setattr(Path, "glob", glob)
    monkeypatch.setattr(Path, "is_file", lambda self: True)  # it was there when checked
    assert check_fits(tmp_path, 1 << 20, local_ranks=1) == 2 << 20


def test_codec_keeps_tuples_and_non_string_keys() -> None:
    state = {"a": (1, 2.5, None), 3: [torch.arange(4), {"b": True}], "c": torch.tensor(1.5)}
    skeleton, tensors = codec.flatten(state)
    back = codec.decode(skeleton, lambda i: tensors[i])
    assert back["a"] == (1, 2.5, None) and isinstance(back["a"], tuple)
    assert torch.equal(back[3][0], torch.arange(4)) and back[3][1] == {"b": True}
    slots, total = codec.plan(tensors)
    assert [s.offset % codec.ALIGN for s in slots] == [0, 0] and total == 128
    assert codec.layout_id(skeleton, slots) != codec.layout_id(*_with(state, "c", torch.zeros(2)))


def _with(state: dict, key: object, value: object) -> tuple:
    skeleton, tensors = codec.flatten({**state, key: value})
    return skeleton, codec.plan(tensors)[0]


def test_an_exception_cutting_a_resize_short_leaves_the_store_usable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The Wrapper raises RankShouldRestart asynchronously, anywhere in the main thread: one landing
    # between closing a slot's old mapping and opening the resized one must not poison later restores.
    from trainer.snapshot import store as store_module

    a = make_state()
    train(a, 1)
    s = store(tmp_path)
    for step in (8, 9):
        a["trainer"].step = step
        s.write(step, build_save_dict(a, 0))
    # Eight more digits, twice, in the trainer's encoded entry (the skeleton holds it as base64): slot 0
    # is resized.
    a["trainer"].step = 10**9
    real = store_module._Mapping

    def interrupted(path: Path, size: int | None) -> object:
        if size is not None:
            raise KeyboardInterrupt("asynchronous exception")
        return real(path, size)

    monkeypatch.setattr(store_module, "_Mapping", interrupted)
    with pytest.raises(KeyboardInterrupt):
        s.write(10, build_save_dict(a, 0))
    monkeypatch.setattr(store_module, "_Mapping", real)
    assert [o.header.step for o in s.offers()[0]] == [9, 8]
    s.write(10, build_save_dict(a, 0))
    assert [o.header.step for o in s.offers()[0]] == [10, 9]
