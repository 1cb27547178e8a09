"""Sticky group ranks on the rendezvous' store host (trainer/launcher/patches.py `sticky_group_ranks`):
a node active in the last round keeps its group rank, so its /dev/shm snapshots stay its own."""

from __future__ import annotations

import types
from datetime import timedelta
from pathlib import Path

import pytest

from trainer.launcher.patches import (
    CLAIM_PREFIX,
    claim_previous_rank,
    keep_previous_ranks,
    read_claims,
    sticky_group_ranks,
)
from trainer.launcher.podfiles import read_claim


def test_a_survivor_above_a_lost_node_keeps_its_rank_and_the_spare_fills_the_hole() -> None:
    # Round 1: a, b, c active (0, 1, 2); s stands by. Round 2: a lost; NVRx compacts b -> 0, c -> 1, s -> 2.
    nvrx = {"b": 0, "c": 1, "s": 2}
    assert keep_previous_ranks(nvrx, {"a": 0, "b": 1, "c": 2}, 3) == {"b": 1, "c": 2, "s": 0}


def test_standby_ranks_and_a_first_round_are_nvrx_own() -> None:
    nvrx = {"a": 0, "b": 1, "s": 2, "t": 3}
    assert keep_previous_ranks(nvrx, {}, 2) == nvrx
    # A previous standby (rank >= world) has no rank to keep.
    assert keep_previous_ranks({"b": 0, "s": 1, "c": 2}, {"a": 0, "b": 1, "c": 2}, 2) == {
        "b": 1,
        "s": 0,
        "c": 2,
    }


def test_a_survivor_slower_than_the_spare_still_gets_its_rank_back() -> None:
    # NVRx closed the round with the spare and b active and a (a survivor, a moment late) on standby.
    assert keep_previous_ranks({"s": 0, "b": 1, "a": 2}, {"a": 0, "b": 1}, 2) == {"a": 0, "b": 1, "s": 2}
    # Unless a is no candidate for an active rank this round (NVRx's standby-only participants).
    nvrx = {"s": 0, "b": 1, "a": 2}
    assert keep_previous_ranks(nvrx, {"a": 0, "b": 1}, 2, {"s", "b"}) == nvrx


@pytest.fixture
def barrier(monkeypatch: pytest.MonkeyPatch) -> tuple[types.ModuleType, object]:
    import torch.distributed as dist
    from nvidia_resiliency_ext.fault_tolerance import ft_rendezvous_barrier as module

    from trainer.runtime.ports import free_port

    state_cls = module._RendezvousBarrierState
    monkeypatch.setattr(state_cls, "_assign_group_ranks", state_cls._assign_group_ranks)  # undone after
    store = dist.TCPStore("127.0.0.1", free_port(span=1), is_master=True, timeout=timedelta(seconds=5))
    return module, state_cls(store, "sticky-test", is_store_host=True)


def _participants(module: types.ModuleType, names: list[str]) -> dict[str, tuple]:
    return {n: (module._NodeDesc(n, 100 + i, 0), i, "none", None) for i, n in enumerate(names)}


def _round(state: object, people: dict[str, tuple], present: list[str], world: int) -> dict[str, int]:
    ranks = state._assign_group_ranks([people[n] for n in present], world)  # type: ignore[attr-defined]
    by_desc = {p[0]: n for n, p in people.items()}
    return {by_desc[d]: r for d, r in ranks.items()}


def test_nvrx_assignment_as_shipped_moves_survivors_down(barrier: tuple[types.ModuleType, object]) -> None:
    """Canary: NVRx's own assignment compacts ranks after a loss, so a survivor's rank (and the meaning
    of its /dev/shm snapshots) changes. Fails once NVRx keeps survivors' ranks: drop the patch then."""
    module, state = barrier
    people = _participants(module, ["a", "b", "c", "s"])
    assert _round(state, people, ["a", "b", "c", "s"], 3) == {"a": 0, "b": 1, "c": 2, "s": 3}
    assert _round(state, people, ["b", "c", "s"], 3) == {"b": 0, "c": 1, "s": 2}


def test_patched_assignment_keeps_survivors(barrier: tuple[types.ModuleType, object]) -> None:
    module, state = barrier
    assert sticky_group_ranks(module) and sticky_group_ranks(module)  # wraps once
    people = _participants(module, ["a", "b", "c", "s"])
    assert _round(state, people, ["a", "b", "c", "s"], 3) == {"a": 0, "b": 1, "c": 2, "s": 3}
    assert _round(state, people, ["b", "c", "s"], 3) == {"b": 1, "c": 2, "s": 0}
    # The next loss: c; the lost node's replacement (a, back as a new spare) fills c's rank.
    assert _round(state, people, ["a", "b", "s"], 3) == {"a": 2, "b": 1, "s": 0}


def test_segment_aware_rounds_keep_nvrx_assignment(barrier: tuple[types.ModuleType, object]) -> None:
    module, state = barrier
    sticky_group_ranks(module)
    state.segment = 1  # type: ignore[attr-defined]
    people = _participants(module, ["a", "b", "c"])
    people = {n: (p[0], p[1], f"dom{p[1]}", None) for n, p in people.items()}
    assert _round(state, people, ["a", "b", "c"], 2) == {"a": 0, "b": 1, "c": 2}
    assert _round(state, people, ["b", "c"], 2) == {"b": 0, "c": 1}


def test_a_launcher_started_again_on_its_pod_keeps_its_rank(barrier: tuple[types.ModuleType, object]) -> None:
    """A node with an infrastructure rank (GROUP_RANK) is that rank, not its launcher process: the
    supervisor's new ft_launcher on the same pod (a new descriptor, the same infrastructure rank) gets
    its group rank back, not the spare that NVRx's order would put first."""
    module, state = barrier
    sticky_group_ranks(module)
    infra = {"s": 0, "a": 1, "b": 2, "b2": 2}  # b2: b's pod, its launcher started again
    people = {n: (module._NodeDesc(n, 100 + i, 0), infra[n], "none", None) for i, n in enumerate(infra)}
    assert _round(state, people, ["a", "b"], 2) == {"a": 0, "b": 1}
    # NVRx alone ranks s (infra 0) and a first; keyed by descriptor, b2 would be a stranger and stand by.
    assert _round(state, people, ["s", "a", "b2"], 2) == {"a": 0, "b2": 1, "s": 2}


def _claim(state: object, people: dict[str, tuple], name: str, rank: int) -> None:
    """What `claim_previous_rank` writes for a joining node."""
    state.store.set(f"{CLAIM_PREFIX}{people[name][0]!r}", str(rank))  # type: ignore[attr-defined]


def test_a_new_host_honours_claims(barrier: tuple[types.ModuleType, object]) -> None:
    """A replaced rendezvous service remembers nothing. The pods' claims (each launcher's last group
    rank) give the survivors their ranks back; the lost node's replacement pod, infrastructure rank 0
    and an empty /dev/shm, which NVRx's order would put first, stands by. Seen before the claims: it
    took rank 0 and the job started over from its durable checkpoint."""
    module, state = barrier
    sticky_group_ranks(module)
    infra = {"pod0-new": 0, "pod1": 1, "pod2": 2}
    people = {n: (module._NodeDesc(n, 100 + i, 0), infra[n], "none", None) for i, n in enumerate(infra)}
    # Without claims, NVRx's order: the replacement is rank 0.
    assert _round(state, people, ["pod0-new", "pod1", "pod2"], 2) == {"pod0-new": 0, "pod1": 1, "pod2": 2}
    fresh = module._RendezvousBarrierState(state.store, "sticky-test-2", is_store_host=True)  # type: ignore[attr-defined]
    _claim(fresh, people, "pod0-new", -1)
    _claim(fresh, people, "pod1", 0)
    _claim(fresh, people, "pod2", 1)
    assert _round(fresh, people, ["pod0-new", "pod1", "pod2"], 2) == {"pod1": 0, "pod2": 1, "pod0-new": 2}
    # From then on the host's memory decides; a claim of a rank held in memory is ignored.
    _claim(fresh, people, "pod0-new", 0)
    assert _round(fresh, people, ["pod0-new", "pod1", "pod2"], 2) == {"pod1": 0, "pod2": 1, "pod0-new": 2}


def test_conflicting_or_garbled_claims_leave_nvrx_order(barrier: tuple[types.ModuleType, object]) -> None:
    """A claim is only a hint: two pods claiming one rank keep only the first claim (in NVRx's order),
    a claim that is no number is none, and nodes that wrote nothing are ranked by NVRx."""
    module, state = barrier
    sticky_group_ranks(module)
    people = _participants(module, ["a", "b", "c"])
    _claim(state, people, "a", 1)
    _claim(state, people, "b", 1)
    state.store.set(f"{CLAIM_PREFIX}{people['c'][0]!r}", "not-a-rank")  # type: ignore[attr-defined]
    assert _round(state, people, ["a", "b", "c"], 2) == {"a": 1, "b": 0, "c": 2}
    assert read_claims(state.store, [people["c"][0], people["a"][0]]) == {people["a"][0]: 1}  # type: ignore[attr-defined]
    assert read_claims(None, [people["a"][0]]) == {}


def test_a_launcher_remembers_the_rank_a_round_gave_it_and_claims_it_next_time(
    barrier: tuple[types.ModuleType, object], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    module, state = barrier
    state_cls = module._RendezvousBarrierState
    claims: list[bytes] = []

    def nvrx_join(self: object, node_desc: object, *args: object, **kwargs: object) -> tuple[int, int]:
        claims.append(bytes(self.store.get(f"{CLAIM_PREFIX}{node_desc!r}")))  # type: ignore[attr-defined]
        return (1, 2)

    monkeypatch.setattr(state_cls, "perform_rendezvous", nvrx_join)
    claim_file = tmp_path / "rendezvous.rank"
    assert claim_previous_rank(module, str(claim_file)) and claim_previous_rank(module, str(claim_file))
    desc = module._NodeDesc("pod", 1, 0)
    assert state.perform_rendezvous(desc, 2, 3) == (1, 2)  # type: ignore[attr-defined]
    assert state.perform_rendezvous(desc, 2, 3) == (1, 2)  # type: ignore[attr-defined]
    assert claims == [b"-1", b"1"] and claim_file.read_text() == "1"
    claim_file.write_text("garbled")
    assert read_claim(str(claim_file)) == -1 and read_claim(None) == -1
