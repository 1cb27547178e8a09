"""Damaged copies of a rank's state: the two fault kinds that make them (trainer/runtime/faults.py
`snapshot-corrupt`, `replica-corrupt`), what the holder of a damaged replica does with it (quarantine,
report once), and how the skips are counted (Contract 3's `restore_skipped`, the live metric and
summary.json agree). The restores that skip them are tests/trainer/recovery/test_restore_agreement.py
(one rank) and tests/trainer/snapshot/test_snapshot_peer_restore.py (two nodes, exact digest)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from trainer.events.metrics import summarize
from trainer.events.metrics_export import EventTail, fold_families
from trainer.runtime import faults as faults_module
from trainer.runtime.faults import FaultInjector, parse_fault
from trainer.snapshot import replica_net
from trainer.snapshot.replica_shelf import ReplicaShelf
from trainer.snapshot.store import SnapshotStore
from trainer.state.save_dict import build_save_dict


def _committed(root: Path, steps: tuple[int, ...], rank: int = 0) -> SnapshotStore:
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 64)
    store = SnapshotStore(root, rank=rank, world_size=2, fingerprint="run")
    for step in steps:
        store.write(step, build_save_dict({"model": model}, rank))
        store.wait()
    return store


def test_the_fault_kinds_parse_and_a_bad_field_is_named_in_one_line() -> None:
    spec = parse_fault("snapshot-corrupt:step=5:rank=1")
    assert (spec.kind, spec.step, spec.rank) == ("snapshot-corrupt", 5, 1)
    assert parse_fault("replica-corrupt:step=2:rank=3").kind == "replica-corrupt"
    for bad, field in [
        ("snapshot-corrupt:step=x", "step must be an integer"),
        ("replica-corrupt:step=2:rank=-1", "rank must be >= 0"),
        ("replica-corrupt:rank=1", "needs step=N"),
        ("snapshot-corrupt:step=2:slot=1", "bad part 'slot=1'"),
    ]:
        with pytest.raises(ValueError, match=field) as err:
            parse_fault(bad)
        assert "\n" not in str(err.value)


def test_damage_newest_leaves_the_header_whole_and_the_slot_is_refused_as_corrupt(tmp_path: Path) -> None:
    store = _committed(tmp_path, (1, 2))
    slot = store.damage_newest()
    (newest, _older), _ = SnapshotStore(tmp_path, rank=0, world_size=2, fingerprint="run").offers(
        verify_payload=False
    )
    assert newest.slot == slot and newest.header.step == 2, "the header must still read as the newest"
    offers, rejected = SnapshotStore(tmp_path, rank=0, world_size=2, fingerprint="run").offers()
    assert [o.header.step for o in offers] == [1]
    assert [(r.step, r.corrupt, r.reason) for r in rejected] == [(2, True, "payload checksum mismatch")]
    store.close()


class _Killed(Exception):
    pass


def test_snapshot_corrupt_fires_on_its_rank_once_then_kills(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def kill(sig: Any) -> None:
        raise _Killed

    monkeypatch.setattr(faults_module, "_kill_self", kill)
    specs = [parse_fault("snapshot-corrupt:step=3:rank=1")]
    fired: list[tuple[str, int]] = []
    damaged: list[int] = []
    for rank in (0, 1):
        injector = FaultInjector(
            specs, rank=rank, node=0, marker_dir=tmp_path, emit=lambda f, s: fired.append((f, s))
        )
        injector.at_step(2, corrupt_snapshot=lambda r=rank: damaged.append(r))
        if rank == 1:
            with pytest.raises(_Killed):
                injector.at_step(3, corrupt_snapshot=lambda r=rank: damaged.append(r))
            injector.at_step(
                3, corrupt_snapshot=lambda r=rank: damaged.append(r)
            )  # its restart: once per run
        else:
            injector.at_step(3, corrupt_snapshot=lambda r=rank: damaged.append(r))
    assert fired == [("snapshot-corrupt", 3)] and damaged == [1]


def test_replica_corrupt_fires_only_on_the_rank_keeping_that_replica(tmp_path: Path) -> None:
    specs = [parse_fault("replica-corrupt:step=4:rank=2")]
    fired: list[tuple[int, str]] = []
    damaged: list[tuple[int, int]] = []
    for rank, keeps in [(0, 1), (3, 2), (1, 0)]:  # rank 3 keeps rank 2's replica
        injector = FaultInjector(
            specs, rank=rank, node=rank, marker_dir=tmp_path, emit=lambda f, s, r=rank: fired.append((r, f))
        )
        for step in (3, 4, 4):
            injector.at_step(
                step,
                damage_replicas=lambda owner, r=rank: damaged.append((r, owner)),
                keeps_replica_of=lambda owner, k=keeps: owner == k,
            )
    assert fired == [(3, "replica-corrupt")] and damaged == [(3, 2)]


KEY = b"k" * 32


def test_a_holder_damages_what_it_holds_and_receives_then_reports_each_once(tmp_path: Path) -> None:
    owner = _committed(tmp_path / "owner", (3,), rank=1)
    holder = ReplicaShelf(tmp_path / "holder", world_size=2, fingerprint="run")
    server = replica_net.ReplicaServer(holder, "127.0.0.1", key=KEY)
    try:
        (offer,), _ = owner.offers()
        replica_net.put(
            server.address, 1, 3, owner.path(offer.slot), owner.path(offer.slot).stat().st_size, key=KEY
        )
        assert [(h.owner, h.step) for h in holder.held()] == [(1, 3)] and holder.take_damaged() == []
        assert holder.damage_all(1) == 1
        assert holder.held() == []
        assert holder.take_damaged() == [(1, 3, "payload checksum mismatch")]
        assert holder.held() == [] and holder.take_damaged() == [], "a quarantined replica reported twice"
        # a replica received from now on is damaged once stored (memory gone bad at rest)
        owner.write(4, build_save_dict({"model": torch.nn.Linear(64, 64)}, 1))
        owner.wait()
        newest = next(o for o in owner.offers()[0] if o.header.step == 4)
        path = owner.path(newest.slot)
        replica_net.put(server.address, 1, 4, path, path.stat().st_size, key=KEY)  # verified on receipt
        assert holder.held() == [] and [d[:2] for d in holder.take_damaged()] == [(1, 4)]
    finally:
        server.close()
        owner.close()


def _event(ev: str, t: float, rank: int, **fields: Any) -> str:
    common = {"ev": ev, "t": t, "rank": rank, "pid": 100 + rank, "restart": 1, "iteration": 0}
    return json.dumps({**common, **fields}) + "\n"


def test_skipped_copies_are_counted_per_source_alike_live_and_in_the_summary(tmp_path: Path) -> None:
    lines = {
        0: [
            _event("run_start", 1.0, 0, world_size=2, config={}, forked=False),
            _event(
                "restore_skipped", 2.0, 0, source="peer", step=3, reason="payload checksum mismatch", owner=1
            ),
            _event("restore", 2.5, 0, step=2, path="", load_s=0.1, source="fsx"),
        ],
        1: [
            _event("restore_skipped", 2.1, 1, source="shm", step=3, reason="payload checksum mismatch"),
            _event("restore_skipped", 2.2, 1, source="peer", step=3, reason="rank 0: refused"),
            _event("restore", 2.5, 1, step=2, path="", load_s=0.1, source="fsx"),
        ],
    }
    for rank, evs in lines.items():
        (tmp_path / f"events.rank{rank}.jsonl").write_text("".join(evs))
    assert summarize(tmp_path)["restore_skipped"] == {"peer": 2, "shm": 1}
    tail = EventTail(tmp_path)
    tail.poll()
    assert tail.fold.restore_skipped == {"peer": 2, "shm": 1}
    (family,) = [f for f in fold_families(tail.fold, now=3.0) if f.name == "trainer_restore_copies_skipped"]
    assert {s.labels["source"]: s.value for s in family.samples if s.name.endswith("_total")} == {
        "peer": 2.0,
        "shm": 1.0,
    }
