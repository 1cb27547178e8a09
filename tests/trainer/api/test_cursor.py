"""trainer/api/cursor.py: `SampleCursor` draws deterministic, disjoint per-rank batches of a map-style
dataset, and its one number (the global sample position) resumes exactly, also on another world size."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
import torch

from trainer.api import SampleCursor

SIZE = 24


def dataset(size: int = SIZE) -> list[dict[str, torch.Tensor]]:
    """Samples that say which they are: `id` is the index."""
    return [{"id": torch.tensor(i), "x": torch.full((3,), float(i))} for i in range(size)]


def ids(batch: dict[str, torch.Tensor]) -> list[int]:
    assert torch.equal(batch["x"][:, 0].long(), batch["id"])  # the collate kept samples whole
    return [int(i) for i in batch["id"]]


def cursors(world: int, batch_size: int, seed: int = 7, **kw: Any) -> list[SampleCursor]:
    data = dataset(kw.pop("size", SIZE))
    return [SampleCursor(data, batch_size, rank=r, world_size=world, seed=seed, **kw) for r in range(world)]


def step(ranks: list[SampleCursor]) -> list[int]:
    """One step of every rank: the global sample ids in rank order."""
    return [i for c in ranks for i in ids(next(c))]


def test_batches_are_deterministic_for_a_seed() -> None:
    a, b = SampleCursor(dataset(), 4, seed=3), SampleCursor(dataset(), 4, seed=3)
    first = [ids(next(a)) for _ in range(10)]
    assert first == [ids(next(b)) for _ in range(10)]
    other = SampleCursor(dataset(), 4, seed=4)
    assert [ids(next(other)) for _ in range(10)] != first
    assert first[:6] != [list(range(i * 4, i * 4 + 4)) for i in range(6)]  # shuffled by default


def test_iter_is_the_cursor_itself() -> None:
    cursor = SampleCursor(dataset(), 2)
    assert iter(cursor) is cursor
    assert ids(next(iter(cursor))) == ids(SampleCursor(dataset(), 2).__next__())


def test_ranks_see_disjoint_samples_and_together_one_epoch() -> None:
    ranks = cursors(2, 3)
    seen = []
    for _ in range(SIZE // 6):
        r0, r1 = ids(next(ranks[0])), ids(next(ranks[1]))
        assert len(r0) == len(r1) == 3 and not set(r0) & set(r1), (r0, r1)
        seen += r0 + r1
    assert sorted(seen) == list(range(SIZE))  # 4 steps of 2 x 3 samples: the epoch, each sample once
    # The same global order as one rank taking the whole global batch.
    single = SampleCursor(dataset(), 6, seed=7)
    assert seen == [i for _ in range(SIZE // 6) for i in ids(next(single))]
    assert all(c.position == SIZE for c in ranks)


def test_resume_in_a_fresh_cursor_continues_exactly() -> None:
    uninterrupted = SampleCursor(dataset(), 5, seed=11)
    interrupted = SampleCursor(dataset(), 5, seed=11)
    for _ in range(7):  # across an epoch boundary (24 samples)
        assert ids(next(uninterrupted)) == ids(next(interrupted))
    state = interrupted.state_dict()
    assert state == {"position": 35, "seed": 11, "size": SIZE}
    fresh = SampleCursor(dataset(), 5, seed=11)
    fresh.load_state_dict(state)
    assert [ids(next(fresh)) for _ in range(9)] == [ids(next(uninterrupted)) for _ in range(9)]


def test_state_dict_is_plain_numbers() -> None:
    cursor = SampleCursor(dataset(), 2, rank=1, world_size=2, seed=5)
    next(cursor)
    state = cursor.state_dict()
    assert state == {"position": 4, "seed": 5, "size": SIZE}
    assert all(type(v) is int for v in state.values())


@pytest.mark.parametrize(("before", "after"), [((2, 3), (3, 2)), ((2, 3), (1, 4)), ((4, 1), (2, 5))])
def test_resume_on_another_world_size_neither_repeats_nor_skips(
    before: tuple[int, int], after: tuple[int, int]
) -> None:
    (w1, b1), (w2, b2) = before, after
    old = cursors(w1, b1)
    seen = [i for _ in range(3) for i in step(old)]
    states = [c.state_dict() for c in old]
    assert all(s == states[0] for s in states)  # every rank holds the same global position
    new = cursors(w2, b2)
    for c in new:
        c.load_state_dict(states[0])
    seen += [i for _ in range(5) for i in step(new)]
    total = 3 * w1 * b1 + 5 * w2 * b2
    # The same global sample sequence as one uninterrupted cursor: no repeat, no skip.
    reference = SampleCursor(dataset(), 1, seed=7)
    assert seen == [ids(next(reference))[0] for _ in range(total)]
    counts = Counter(seen)
    epochs, rest = divmod(total, SIZE)
    assert sorted(counts.values()) == sorted([epochs + 1] * rest + [epochs] * (SIZE - rest))


def test_load_refuses_another_seed_or_dataset() -> None:
    state = SampleCursor(dataset(), 2, seed=1).state_dict()
    with pytest.raises(ValueError, match=r"^data: .*seed 1 over 24 samples.*seed 2 over 24"):
        SampleCursor(dataset(), 2, seed=2).load_state_dict(state)
    with pytest.raises(ValueError, match=r"^data: .*seed 1 over 24 samples.*seed 1 over 25"):
        SampleCursor(dataset(25), 2, seed=1).load_state_dict(state)
    fine = SampleCursor(dataset(), 3, rank=1, world_size=4, seed=1)  # batch and world may differ
    fine.load_state_dict({**state, "position": 10})
    assert fine.position == 10


def test_epochs_reshuffle() -> None:
    cursor = SampleCursor(dataset(), SIZE, seed=2)
    epochs = [ids(next(cursor)) for _ in range(3)]
    assert all(sorted(e) == list(range(SIZE)) for e in epochs)
    assert epochs[0] != epochs[1] != epochs[2] != epochs[0]


def test_batches_straddle_epochs() -> None:
    cursor = SampleCursor(dataset(10), 4, seed=2)
    seen = [i for _ in range(5) for i in ids(next(cursor))]
    assert sorted(seen[:10]) == list(range(10)) and sorted(seen[10:20]) == list(range(10))


def test_shuffle_off_is_sequential() -> None:
    ranks = cursors(2, 3, shuffle=False, size=10)
    assert [ids(next(c)) for c in ranks] == [[0, 1, 2], [3, 4, 5]]
    assert [ids(next(c)) for c in ranks] == [[6, 7, 8], [9, 0, 1]]
    assert [ids(next(c)) for c in ranks] == [[2, 3, 4], [5, 6, 7]]


def test_job_gives_rank_world_and_seed() -> None:
    class FakeJob:
        rank, world_size, seed = 1, 2, 7

    cursor = SampleCursor(dataset(), 3, job=FakeJob(), rank=0, world_size=1, seed=0)  # type: ignore[arg-type]
    assert (cursor.rank, cursor.world_size, cursor.seed) == (1, 2, 7)
    assert ids(next(cursor)) == ids(next(cursors(2, 3)[1]))


def test_custom_collate() -> None:
    cursor = SampleCursor(list(range(5)), 2, shuffle=False, collate=list)
    assert next(cursor) == [0, 1] and next(cursor) == [2, 3] and next(cursor) == [4, 0]


@pytest.mark.parametrize("batch_size", [0, -1])
def test_batch_size_below_one(batch_size: int) -> None:
    with pytest.raises(ValueError, match=rf"batch_size: must be >= 1, got {batch_size}"):
        SampleCursor(dataset(), batch_size)


def test_empty_dataset() -> None:
    with pytest.raises(ValueError, match="dataset: is empty"):
        SampleCursor([], 1)


@pytest.mark.parametrize(("rank", "world"), [(2, 2), (-1, 2), (0, 0)])
def test_rank_outside_the_world(rank: int, world: int) -> None:
    with pytest.raises(ValueError, match="rank: must be in"):
        SampleCursor(dataset(), 1, rank=rank, world_size=world)
