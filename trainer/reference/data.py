"""Memory-mapped token data and a deterministic, resumable batch cursor.

Token files are `.npy` arrays (uint16 when the vocabulary fits, else uint32) so that they carry their own
dtype and length and can be memory-mapped from shared storage without loading them: every rank of every
pod maps the same file, and the page cache shares it between local ranks.

Determinism: the micro-batch that rank r sees at global step s depends only on (seed, s, r, world_size,
micro_batch_size, seq_len). Sample k of the run is window perm_e[k mod W] of epoch e = k // W, where W
is the number of non-overlapping windows in the file and perm_e a permutation seeded by (seed, e). A
resumed run therefore sees exactly the batches the uninterrupted run would have seen.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trainer.config.flags import int64
from trainer.config.inputs import TOKEN_FILE_MAX_BYTES, open_regular
from trainer.reference.data_check import TOKEN_DTYPES, read_header, write_meta

_CHUNK = 1 << 22  # tokens generated per chunk when writing, to bound memory for large files


def write_synthetic_tokens(path: str | Path, num_tokens: int, vocab_size: int, seed: int) -> Path:
    """Write `num_tokens` synthetic tokens to `path` (.npy) and return the path.

    The tokens are not uniform noise: they are runs of arithmetic progressions (start, start+stride, ...
    mod vocab) with random starts, strides and run lengths, so a model can learn them in context and the
    loss visibly falls in a demo. Same arguments, same bytes.
    """
    if num_tokens < 2:
        raise ValueError(f"num_tokens: must be >= 2, got {num_tokens}")
    if not 2 <= vocab_size <= 2**32:
        raise ValueError(f"vocab_size: must be in [2, 2**32], got {vocab_size}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    dtype = np.uint16 if vocab_size <= 2**16 else np.uint32
    rng = np.random.default_rng(seed)
    tmp = path.with_name(path.name + ".tmp.npy")
    out = np.lib.format.open_memmap(tmp, mode="w+", dtype=dtype, shape=(num_tokens,))
    max_token = 0
    for lo in range(0, num_tokens, _CHUNK):
        n = min(_CHUNK, num_tokens - lo)
        out[lo : lo + n] = chunk = _progressions(rng, n, vocab_size).astype(dtype)
        max_token = max(max_token, int(chunk.max()))
    out.flush()
    del out
    # The recorded maximum lets start-up checks compare ids with the vocabulary without a full scan.
    write_meta(path, num_tokens=num_tokens, dtype=np.dtype(dtype), max_token=max_token, vocab=vocab_size)
    tmp.replace(path)  # readers never see a half-written file
    return path


def _progressions(rng: np.random.Generator, n: int, vocab_size: int) -> np.ndarray:
    """n tokens made of arithmetic progressions mod vocab_size with random run lengths in [8, 128)."""
    lengths = rng.integers(8, 128, size=n // 8 + 1)
    run_id = np.repeat(np.arange(lengths.size), lengths)[:n]
    starts = np.concatenate(([0], np.cumsum(lengths)[:-1]))
    pos = np.arange(n) - starts[run_id]
    first = rng.integers(0, vocab_size, size=lengths.size)
    stride = rng.integers(1, 8, size=lengths.size)
    return (first[run_id] + pos * stride[run_id]) % vocab_size


class TokenDataset:
    """A read-only, memory-mapped 1-D token array."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"data_path: no token file at {self.path}")
        # One descriptor for the header and the map (trainer/config/inputs.py): no FIFO, device or symlink
        # loop, and the map is of the file whose header was read, even if the path is replaced meanwhile.
        with open_regular(self.path, "data_path", max_bytes=TOKEN_FILE_MAX_BYTES) as f:
            dtype, shape, offset = read_header(f)
            if len(shape) != 1 or dtype not in TOKEN_DTYPES:
                raise ValueError(
                    f"data_path: {self.path} must hold a 1-D uint16/uint32 array, got {dtype}{shape}"
                )
            if offset + int(shape[0]) * dtype.itemsize > f.size:
                raise ValueError(f"data_path: {self.path} is shorter than its header promises")
            with open(f.fd, "rb", closefd=False) as fh:
                self.tokens = np.memmap(fh, dtype=dtype, mode="r", offset=offset, shape=shape)

    def __len__(self) -> int:
        return int(self.tokens.shape[0])

    def max_token(self) -> int:
        """Largest token id (reads the whole file: for validation in tests and tools, not the hot path)."""
        return int(self.tokens.max())


class BatchCursor:
    """Yields this rank's (inputs, targets) micro-batches step by step; resumable via state_dict."""

    def __init__(
        self,
        dataset: TokenDataset,
        seq_len: int,
        micro_batch_size: int,
        rank: int,
        world_size: int,
        seed: int,
    ) -> None:
        if seq_len < 1:
            raise ValueError(f"seq_len: must be >= 1, got {seq_len}")
        if micro_batch_size < 1:
            raise ValueError(f"micro_batch_size: must be >= 1, got {micro_batch_size}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank: must be in [0, world_size={world_size}), got {rank}")
        self.num_windows = (len(dataset) - 1) // seq_len  # +1 token per window for the shifted target
        if self.num_windows < 1:
            raise ValueError(
                f"seq_len: {seq_len} needs at least {seq_len + 1} tokens, file has {len(dataset)}"
            )
        self.dataset, self.seq_len, self.micro_batch_size = dataset, seq_len, micro_batch_size
        self.rank, self.world_size, self.seed = rank, world_size, seed
        self.step = 0
        # Where the current (world_size, micro_batch_size) layout started: lets a resharded resume continue
        # at the same global sample position instead of replaying or skipping data.
        self._base_step = 0
        self._base_samples = 0
        self._perm_epoch = -1
        self._perm = np.empty(0, dtype=np.int64)

    @property
    def samples_per_step(self) -> int:
        return self.world_size * self.micro_batch_size

    def _sample_index(self, step: int, j: int) -> int:
        return (
            self._base_samples
            + (step - self._base_step) * self.samples_per_step
            + self.rank * self.micro_batch_size
            + j
        )

    def _window(self, sample: int) -> int:
        epoch, k = divmod(sample, self.num_windows)
        if epoch != self._perm_epoch:
            self._perm = np.random.default_rng([self.seed, epoch]).permutation(self.num_windows)
            self._perm_epoch = epoch
        return int(self._perm[k])

    def batch_at(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The micro-batch of this rank at global `step` (pure: does not move the cursor)."""
        rows = []
        for j in range(self.micro_batch_size):
            start = self._window(self._sample_index(step, j)) * self.seq_len
            rows.append(np.asarray(self.dataset.tokens[start : start + self.seq_len + 1], dtype=np.int64))
        window = torch.from_numpy(np.stack(rows))
        return window[:, :-1].contiguous(), window[:, 1:].contiguous()

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The batch of the current step; advances the cursor by one global step."""
        batch = self.batch_at(self.step)
        self.step += 1
        return batch

    def __iter__(self) -> BatchCursor:
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.next_batch()

    def state_dict(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "seed": self.seed,
            "seq_len": self.seq_len,
            "samples_per_step": self.samples_per_step,
            "base_step": self._base_step,
            "base_samples": self._base_samples,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume at `state["step"]`; a different world size or micro-batch keeps the sample position."""
        if int(state["seed"]) != self.seed:
            raise ValueError(f"seed: checkpoint data cursor has seed {state['seed']}, run has {self.seed}")
        if int(state["seq_len"]) != self.seq_len:
            raise ValueError(
                f"seq_len: checkpoint data cursor has {state['seq_len']}, run has {self.seq_len}"
            )
        step = int(state["step"])
        base_step, base_samples = int(state["base_step"]), int(state["base_samples"])
        if int(state["samples_per_step"]) == self.samples_per_step:
            self._base_step, self._base_samples = base_step, base_samples
        else:
            self._base_step = step
            self._base_samples = base_samples + (step - base_step) * int(state["samples_per_step"])
        self.step = step


def main(argv: Sequence[str] | None = None) -> int:
    """CLI: write a synthetic token file."""
    parser = argparse.ArgumentParser(
        prog="python -m trainer.reference.data", description="Write a synthetic memory-mappable token file."
    )
    parser.add_argument("--out", required=True, type=Path, help="output .npy file")
    # The flags' strict integers: ASCII digits within int64 (plain int() reads "١٢" and "1_000").
    parser.add_argument("--tokens", required=True, type=int64, help="number of tokens")
    parser.add_argument("--vocab", required=True, type=int64, help="vocabulary size (token ids < vocab)")
    parser.add_argument("--seed", type=int64, default=0, help="generator seed")
    args = parser.parse_args(argv)
    try:
        path = write_synthetic_tokens(args.out, args.tokens, args.vocab, args.seed)
    except ValueError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {args.tokens} tokens (vocab {args.vocab}) to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
