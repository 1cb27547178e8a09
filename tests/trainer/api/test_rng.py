"""trainer/api/rng.py: the random streams a training script draws from (torch's CPU generator, Python's
`random`, NumPy's legacy global) are captured and restored exactly, pending gaussians included, in a
structure that does not change between steps (a snapshot's layout stays the same)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

from trainer.api import rng
from trainer.state import codec

CPU = torch.device("cpu")
N = 50


@pytest.fixture(autouse=True)
def keep_global_streams() -> Iterator[None]:
    """The test draws from the process-wide generators: leave them as it found them."""
    torch_state, py_state, np_state = torch.get_rng_state(), random.getstate(), np.random.get_state()
    yield
    torch.set_rng_state(torch_state)
    random.setstate(py_state)
    np.random.set_state(np_state)


def draws() -> dict[str, Any]:
    """N values of every stream, gaussians included (each leaves the streams' state as it goes)."""
    return {
        "torch": torch.rand(N),
        "torch_normal": torch.randn(N),
        "python": [random.random() for _ in range(N)],
        "python_gauss": [random.gauss(0.0, 1.0) for _ in range(N - 1)],  # odd: leaves one pending
        "python_int": random.getrandbits(64),
        "numpy": np.random.rand(N),
        "numpy_gauss": np.random.randn(N - 1),  # odd: leaves one pending
        "numpy_int": np.random.randint(0, 2**31, size=N),
    }


def assert_same(a: dict[str, Any], b: dict[str, Any]) -> None:
    assert a.keys() == b.keys()
    for key in a:
        if isinstance(a[key], torch.Tensor):
            assert torch.equal(a[key], b[key]), key
        elif isinstance(a[key], np.ndarray):
            assert np.array_equal(a[key], b[key]), key
        else:
            assert a[key] == b[key], key


def seed_all(seed: int) -> None:
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)


def layout(state: dict[str, torch.Tensor]) -> str:
    skeleton, tensors = codec.flatten(state)
    return codec.layout_id(skeleton, codec.plan(tensors)[0])


@pytest.mark.parametrize("pending", [False, True])
def test_round_trip(pending: bool) -> None:
    seed_all(5)
    torch.rand(3)
    if pending:  # one gaussian cached by Python and by NumPy when the streams are captured
        random.gauss(0.0, 1.0)
        np.random.randn(1)
        assert random.getstate()[2] is not None and np.random.get_state()[3] == 1
    else:
        random.random()
        np.random.rand(1)
        assert random.getstate()[2] is None and np.random.get_state()[3] == 0
    state = rng.capture(CPU)
    first = draws()
    restored_from = {k: v.clone() for k, v in state.items()}
    rng.restore(state, CPU)
    assert_same(draws(), first)
    for key, value in state.items():  # restore reads the state, it does not consume it
        assert torch.equal(value, restored_from[key]), key
    rng.restore(state, CPU)  # and again: the same
    assert_same(draws(), first)


def test_restore_after_other_draws_and_reseeds() -> None:
    seed_all(1)
    random.gauss(0.0, 1.0)
    np.random.randn(3)
    state = rng.capture(CPU)
    expected = draws()
    seed_all(99)  # another run's streams entirely
    draws()
    random.gauss(0.0, 1.0)
    rng.restore(state, CPU)
    assert_same(draws(), expected)


def test_pending_gaussian_is_what_comes_next() -> None:
    seed_all(3)
    random.gauss(0.0, 1.0)
    np.random.randn(1)
    pending_py, pending_np = random.getstate()[2], np.random.get_state()[4]
    state = rng.capture(CPU)
    seed_all(4)
    rng.restore(state, CPU)
    assert random.getstate()[2] == pending_py and np.random.get_state()[4] == pending_np
    assert random.gauss(0.0, 1.0) == pending_py  # the cached value: mu + sigma * gauss_next
    assert float(np.random.standard_normal()) == pending_np


def test_captured_streams_are_tensors() -> None:
    state = rng.capture(CPU)
    assert set(state) == {"torch", "python", "python_gauss", "numpy", "numpy_rest"}
    assert all(isinstance(v, torch.Tensor) for v in state.values())
    assert state["torch"].dtype == torch.uint8


def test_layout_does_not_change_between_steps() -> None:
    seed_all(2)
    random.seed(2)
    np.random.seed(2)
    before = rng.capture(CPU)  # nothing pending
    random.gauss(0.0, 1.0)
    np.random.randn(1)
    pending = rng.capture(CPU)  # a gaussian pending in both
    draws()
    later = rng.capture(CPU)
    assert layout(before) == layout(pending) == layout(later)
    for key in before:
        assert (before[key].dtype, before[key].shape) == (pending[key].dtype, pending[key].shape), key
    assert not torch.equal(before["python_gauss"], pending["python_gauss"])


def test_round_trip_through_the_snapshot_codec() -> None:
    """What a snapshot keeps (the flattened tensors, decoded) restores the same streams."""
    seed_all(8)
    random.gauss(0.0, 1.0)
    np.random.randn(1)
    skeleton, tensors = codec.flatten(rng.capture(CPU))
    copies = [t.clone() for t in tensors]
    expected = draws()
    decoded = codec.decode(skeleton, lambda i: copies[i])
    rng.restore(decoded, CPU)
    assert_same(draws(), expected)


def test_seed_all_depends_on_seed_and_rank_only() -> None:
    def streams() -> dict[str, Any]:
        return {"torch": torch.rand(4), "python": random.random(), "numpy": np.random.rand(4)}

    rng.seed_all(3, 0)
    first = streams()
    draws()
    rng.seed_all(3, 0)
    assert_same(streams(), first)
    rng.seed_all(3, 1)
    other_rank = streams()
    rng.seed_all(4, 0)
    other_seed = streams()
    for key in first:
        assert not np.array_equal(np.asarray(first[key]), np.asarray(other_rank[key])), key
        assert not np.array_equal(np.asarray(first[key]), np.asarray(other_seed[key])), key
