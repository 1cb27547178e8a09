"""NVRx's write results reach the save that wrote them (trainer/checkpoint/nvrx_async.py, item 9).

Every NVRx writer of a process puts its results into one module-global queue, and a save takes whatever
comes first: a save whose results were never taken (abandoned by a fault) handed them to the next save,
which committed a checkpoint whose .metadata named the other save's offsets (seen in make test: every
tensor of a committed checkpoint read 64 bytes off, "unsupported persistent id encountered").
"""

from __future__ import annotations

import io
import os
import time
import types
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist

from trainer.checkpoint.backends import NvrxBackend
from trainer.checkpoint.nvrx_async import results_mismatch


def _result(name: str, offset: int, length: int) -> Any:
    return types.SimpleNamespace(
        storage_data=types.SimpleNamespace(relative_path=name, offset=offset, length=length)
    )


def test_results_must_tile_each_file_they_name(tmp_path: Path) -> None:
    (tmp_path / "__0_0.distcp").write_bytes(b"x" * 100)
    assert (
        results_mismatch([_result("__0_0.distcp", 0, 60), _result("__0_0.distcp", 60, 40)], tmp_path) is None
    )
    shifted = [_result("__0_0.distcp", 0, 64), _result("__0_0.distcp", 64, 40)]  # another save's layout
    assert "the items end at byte 104, the file has 100" in str(results_mismatch(shifted, tmp_path))
    gap = [_result("__0_0.distcp", 0, 50), _result("__0_0.distcp", 60, 40)]
    assert "an item at byte 60, the previous one ends at 50" in str(results_mismatch(gap, tmp_path))
    assert "missing" in str(results_mismatch([_result("__1_0.distcp", 0, 1)], tmp_path))


def _written(backend: NvrxBackend, token: Any) -> None:
    deadline = time.monotonic() + 120
    while not backend.done(token):
        assert time.monotonic() < deadline, "the NVRx worker never finished the write"
        time.sleep(0.05)


def test_a_save_gets_its_own_results_after_an_abandoned_one(tmp_path: Path, one_rank: Any) -> None:
    backend = NvrxBackend(write_timeout_s=120)
    try:
        abandoned = backend.start({"w": torch.ones(4096)}, tmp_path / "a", dist.group.WORLD)
        _written(backend, abandoned)  # written, its results never taken: as a save a fault abandoned
        token = backend.start({"w": torch.arange(16.0)}, tmp_path / "b", dist.group.WORLD)
        _written(backend, token)
        results = backend.results(token)
    finally:
        backend.abort()
    assert results_mismatch(results, tmp_path / "b") is None
    ((name, offset, length),) = {
        (r.storage_data.relative_path, r.storage_data.offset, r.storage_data.length) for r in results
    }
    raw = (tmp_path / "b" / name).read_bytes()[offset : offset + length]
    assert torch.equal(torch.load(io.BytesIO(raw), weights_only=True), torch.arange(16.0))


@pytest.fixture(autouse=True)
def _fresh_worker() -> Any:
    # Each test starts with no stale result of another test's save in this process.
    NvrxBackend.reset_shared_queue()
    yield


def test_the_worker_start_up_warms_the_results_manager_and_the_worker_yields_to_training(
    one_rank: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first save's write results used to make the results Manager import DCP inside that save
    (1.2-1.4 s of the worker's first write; a 16 s first commit in the demo). The worker's start-up now
    sends one DCP WriteResult through the very queue saves use, and takes it back."""
    from nvidia_resiliency_ext.checkpointing.async_ckpt import filesystem_async
    from torch.distributed.checkpoint.storage import WriteResult

    from trainer.checkpoint import nvrx_async

    seen: list[Any] = []

    class Spy:
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def put(self, item: Any) -> None:
            seen.append(item)
            self.inner.put(item)

        def get(self) -> Any:
            return self.inner.get()

    real = nvrx_async.warm_results_manager
    monkeypatch.setattr(nvrx_async, "warm_results_manager", lambda q: real(Spy(q)))
    NvrxBackend.reset_shared_queue()  # a fresh worker, started by the next backend
    backend = NvrxBackend(write_timeout_s=120)
    try:
        assert NvrxBackend._prewarm is not None
        NvrxBackend._prewarm.join(120)
        assert len(seen) == 1
        (results,) = seen[0].values()
        assert [type(r) for r in results] == [WriteResult]
        assert filesystem_async.get_write_results_queue() is not None
        assert nvrx_async.drain_stale_results() == 0  # taken back: no save would find it as stale
        # The worker imports torch at start-up, beside the trainer's restore: it yields to it.
        worker = nvrx_async.worker_process(NvrxBackend._queue).pid
        assert os.getpriority(os.PRIO_PROCESS, worker) >= nvrx_async.WORKER_START_NICE
    finally:
        backend.abort()
