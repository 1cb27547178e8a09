"""Fixtures shared by the trainer tests: a small token file and a 1-rank process group."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from tests.conftest import free_port


@pytest.fixture(scope="module")
def token_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from trainer.data import write_synthetic_tokens
    from trainer.model import PRESETS

    return write_synthetic_tokens(
        tmp_path_factory.mktemp("data") / "tokens.npy", 100_000, PRESETS["tiny"].vocab_size, seed=3
    )


@pytest.fixture
def one_rank(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A 1-rank gloo default group in this process and a 1-device CPU mesh."""
    # monkeypatch restores the environment: a leaked MASTER_ADDR would change later tests' subprocesses.
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()
