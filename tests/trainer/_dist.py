"""Run a function on N gloo ranks in spawned processes, with a bounded wait (owned by engineer "state").

The function must be defined at module level in an importable module (spawn pickles it by name). It is
called as fn(rank, world_size, *args) after the default process group is up, and destroyed afterwards.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import torch.distributed as dist
import torch.multiprocessing as mp

from tests.helpers import free_port


def _entry(rank: int, fn: Callable[..., Any], world_size: int, port: int, args: tuple[Any, ...]) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        fn(rank, world_size, *args)
    finally:
        dist.destroy_process_group()


def run_ranks(fn: Callable[..., Any], world_size: int, *args: Any, timeout_s: float = 120.0) -> None:
    """Run fn on `world_size` ranks; re-raise a rank's exception; kill everything past `timeout_s`."""
    ctx = mp.start_processes(
        _entry, args=(fn, world_size, free_port(), args), nprocs=world_size, join=False, start_method="spawn"
    )
    deadline = time.monotonic() + timeout_s
    while not ctx.join(timeout=max(0.1, deadline - time.monotonic())):
        if time.monotonic() > deadline:
            for proc in ctx.processes:
                if proc.is_alive():
                    proc.kill()
            raise TimeoutError(f"ranks did not finish within {timeout_s} s")
