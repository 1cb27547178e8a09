"""A map-style dataset of token sequences a small model can learn: each item is an arithmetic
progression modulo the vocabulary (start and stride drawn from the item's index), as `input_ids`."""

from __future__ import annotations

import torch


class Progressions:
    def __init__(self, size: int, seq_len: int, vocab_size: int, seed: int = 0) -> None:
        self.size, self.seq_len, self.vocab_size, self.seed = size, seq_len, vocab_size, seed

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        if not 0 <= index < self.size:
            raise IndexError(index)
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + index)
        start, stride = torch.randint(0, self.vocab_size, (2,), generator=g).tolist()
        ids = (start + (stride % 7 + 1) * torch.arange(self.seq_len)) % self.vocab_size
        return {"input_ids": ids}
