"""The random streams a training script draws from, captured and restored exactly.

Dropout and any other torch randomness draw from torch's default CPU generator (and, on a GPU, the
current device's); data code often uses Python's `random` and NumPy's legacy global generator. A resume
that restored the weights but not these streams would train on different dropout masks than the run it
replaces, and exactness would be lost. Each stream is kept as tensors (fixed structure, so a snapshot's
layout never changes between steps): the state dict is per rank (trainer/state/save_dict.py). Each
attempt starts from streams seeded by (seed, rank) (`seed_all`).
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import torch


def seed_all(seed: int, rank: int) -> None:
    """Seed every stream from (seed, rank), before each attempt's training function runs: a fresh run
    then starts from the same streams every time (Python's and NumPy's are seeded from the OS otherwise,
    so two runs would end in different states even with nothing drawn from them). The function may seed
    them itself; `job.loop` then restores whatever state it resumes from."""
    value = int(np.random.SeedSequence([seed, rank]).generate_state(1, np.uint64)[0])
    random.seed(value)
    np.random.seed(value % 2**32)
    torch.manual_seed(value)


def capture(device: torch.device) -> dict[str, torch.Tensor]:
    version, internal, gauss = random.getstate()
    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state(legacy=True)
    out = {
        "torch": torch.get_rng_state(),
        "python": torch.tensor([version, *internal], dtype=torch.int64),
        "python_gauss": torch.tensor([gauss is not None, gauss or 0.0], dtype=torch.float64),
        "numpy": torch.from_numpy(np.asarray(np_keys, dtype=np.int64).copy()),
        "numpy_rest": torch.tensor([np_pos, np_has_gauss, np_gauss], dtype=torch.float64),
    }
    if np_name != "MT19937":  # pragma: no cover - numpy's legacy generator is always MT19937
        raise ValueError(f"unexpected numpy generator {np_name}")
    if device.type == "cuda":
        out["cuda"] = torch.cuda.get_rng_state(device)
    return out


def restore(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(state["torch"].cpu())
    values = [int(v) for v in state["python"].tolist()]
    has_gauss, gauss = state["python_gauss"].tolist()
    random.setstate((values[0], tuple(values[1:]), gauss if has_gauss else None))
    pos, np_has_gauss, np_gauss = state["numpy_rest"].tolist()
    keys = state["numpy"].numpy().astype(np.uint32)
    np.random.set_state(("MT19937", keys, int(pos), int(np_has_gauss), float(np_gauss)))
    if device.type == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state(state["cuda"].cpu(), device)
