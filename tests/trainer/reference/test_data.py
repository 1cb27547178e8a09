"""Token data: synthetic file, memory mapping, a cursor whose batches depend only on (seed, step, rank)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from trainer.reference.data import BatchCursor, TokenDataset, main, write_synthetic_tokens


@pytest.fixture
def tokens(tmp_path: Path) -> TokenDataset:
    return TokenDataset(write_synthetic_tokens(tmp_path / "tok.npy", 20_000, 300, seed=1))


def test_synthetic_file_is_deterministic_and_in_range(tmp_path: Path) -> None:
    a = write_synthetic_tokens(tmp_path / "a.npy", 5000, 300, seed=7)
    b = write_synthetic_tokens(tmp_path / "b.npy", 5000, 300, seed=7)
    c = write_synthetic_tokens(tmp_path / "c.npy", 5000, 300, seed=8)
    assert a.read_bytes() == b.read_bytes() != c.read_bytes()
    ds = TokenDataset(a)
    assert len(ds) == 5000 and ds.tokens.dtype == np.uint16 and ds.max_token() < 300
    assert isinstance(ds.tokens, np.memmap)
    big = TokenDataset(write_synthetic_tokens(tmp_path / "big.npy", 100, 70_000, seed=0))
    assert big.tokens.dtype == np.uint32
    assert not list(tmp_path.glob("*.tmp*"))


def test_cli_writes_a_file_and_rejects_bad_args(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "d" / "t.npy"
    assert main(["--out", str(out), "--tokens", "1000", "--vocab", "50", "--seed", "2"]) == 0
    assert len(TokenDataset(out)) == 1000
    assert main(["--out", str(out), "--tokens", "1", "--vocab", "50"]) == 2
    assert "config error: num_tokens:" in capsys.readouterr().err


def test_batches_shift_targets_and_partition_ranks(tokens: TokenDataset) -> None:
    cursors = [BatchCursor(tokens, 16, 3, r, 2, seed=0) for r in range(2)]
    starts = set()
    for _ in range(5):
        for cur in cursors:
            x, y = cur.next_batch()
            assert x.shape == y.shape == (3, 16) and x.dtype == torch.int64
            assert torch.equal(x[:, 1:], y[:, :-1])  # targets are the inputs shifted by one
            starts.update(tuple(row[:4].tolist()) for row in x)
    assert len(starts) == 5 * 2 * 3  # no window is served twice within an epoch


def test_batch_depends_only_on_seed_step_rank_and_resumes_exactly(tokens: TokenDataset) -> None:
    straight = BatchCursor(tokens, 16, 2, 1, 2, seed=3)
    expected = [straight.next_batch() for _ in range(8)]
    first = BatchCursor(tokens, 16, 2, 1, 2, seed=3)
    for _ in range(5):
        first.next_batch()
    state = first.state_dict()
    resumed = BatchCursor(tokens, 16, 2, 1, 2, seed=3)
    resumed.load_state_dict(state)
    for step in range(5, 8):
        x, y = resumed.next_batch()
        assert torch.equal(x, expected[step][0]) and torch.equal(y, expected[step][1])
    other_seed = BatchCursor(tokens, 16, 2, 1, 2, seed=4)
    assert not torch.equal(other_seed.batch_at(0)[0], expected[0][0])
    with pytest.raises(ValueError, match=r"^seed:"):
        other_seed.load_state_dict(state)


def test_resharded_resume_continues_at_the_same_sample(tokens: TokenDataset) -> None:
    # 2 ranks x 2 samples for 3 steps = 12 samples; then 1 rank x 4 samples must serve samples 12..15.
    two = [BatchCursor(tokens, 16, 2, r, 2, seed=0) for r in range(2)]
    for _ in range(3):
        for cur in two:
            cur.next_batch()
    reference = [BatchCursor(tokens, 16, 2, r, 2, seed=0).batch_at(3)[0] for r in range(2)]
    one = BatchCursor(tokens, 16, 4, 0, 1, seed=0)
    one.load_state_dict(two[0].state_dict())
    assert one.step == 3
    torch.testing.assert_close(one.next_batch()[0], torch.cat(reference))


def test_epochs_wrap_with_a_new_order(tokens: TokenDataset) -> None:
    cur = BatchCursor(tokens, 1000, 1, 0, 1, seed=0)  # 19 windows
    assert cur.num_windows == 19
    epoch0 = [cur.next_batch()[0][0, 0].item() for _ in range(19)]
    epoch1 = [cur.next_batch()[0][0, 0].item() for _ in range(19)]
    assert sorted(epoch0) == sorted(epoch1) and epoch0 != epoch1


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"seq_len": 0}, "seq_len"), ({"micro_batch_size": 0}, "micro_batch_size"), ({"rank": 2}, "rank")],
)
def test_bad_cursor_args_name_the_field(tokens: TokenDataset, kwargs: dict[str, int], field: str) -> None:
    args = {"seq_len": 16, "micro_batch_size": 2, "rank": 0, "world_size": 2, "seed": 0} | kwargs
    with pytest.raises(ValueError, match=rf"^{field}:"):
        BatchCursor(tokens, **args)


def test_missing_file_names_the_field(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"^data_path:"):
        TokenDataset(tmp_path / "nope.npy")
