"""A per-rank entry as one opaque value (trainer/state/entry_blob.py): whatever its structure, it
comes back as saved, key types, tuples and tensors included; anything else is refused, never guessed."""

from __future__ import annotations

import pytest
import torch

from trainer.state import entry_blob


def test_round_trip_keeps_structure_key_types_and_tensors() -> None:
    state = {
        "step": 7,
        "fixed": {0: 1.5, 1: -2.0, "2": None},
        "grown": {str(i): i + 0.5 for i in range(5)},
        "pair": (torch.arange(6, dtype=torch.int16).reshape(2, 3), [True, "s"]),
        "rng": torch.get_rng_state(),
        "empty": [],
        "blob": b"\x00\xffraw",
        "scalar": torch.tensor(3.0, dtype=torch.float64),
    }
    back = entry_blob.decode(entry_blob.encode(state))
    assert set(back) == set(state) and back["fixed"] == state["fixed"] and back["grown"] == state["grown"]
    assert list(back["fixed"]) == [0, 1, "2"]  # int keys stay ints
    assert isinstance(back["pair"], tuple) and back["pair"][1] == [True, "s"]
    assert torch.equal(back["pair"][0], state["pair"][0]) and back["pair"][0].dtype == torch.int16
    assert torch.equal(back["rng"], state["rng"]) and back["empty"] == [] and back["blob"] == b"\x00\xffraw"
    assert back["scalar"].shape == () and back["scalar"].item() == 3.0


def test_a_decoded_tensor_does_not_alias_the_blob() -> None:
    blob = bytearray(entry_blob.encode({"t": torch.zeros(4)}))
    t = entry_blob.decode(blob)["t"]
    blob[-1] = 0xFF
    assert torch.equal(t, torch.zeros(4))


@pytest.mark.parametrize(
    "bad",
    [b"", b"short", b"NOTMAGIC" + bytes(8), entry_blob.encode({"t": torch.zeros(4)})[:-3], "a string", None],
)
def test_anything_else_is_refused(bad: object) -> None:
    with pytest.raises(ValueError, match="encoded entry"):
        entry_blob.decode(bad)


def test_an_unencodable_value_names_its_type() -> None:
    with pytest.raises(TypeError, match="cannot hold a set"):
        entry_blob.encode({"s": {1, 2}})
