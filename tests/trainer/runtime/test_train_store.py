"""The training group's store is up before any other rank looks for it (trainer/runtime/train.py).

Rank 0 hosts it when its Trainer is built, before the in-process Wrapper's initial barrier; the other
ranks connect only after that barrier. Hosted in the first attempt instead, it came up while they were
connecting, and torch's client backs off about half a second after a refused connect.
"""

from __future__ import annotations

import os
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch.distributed as dist

from trainer.config.train_config import config_from_args
from trainer.runtime.ports import free_port
from trainer.runtime.train import Trainer


def _trainer(rank: int, token_file: Path, out: Path, port: int, monkeypatch: pytest.MonkeyPatch) -> Trainer:
    for name, value in {
        "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank), "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port + 2), "TRAINER_PG_PORT": str(port), "TRAINER_INPROCESS_PORT": str(port + 1),
    }.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    cfg = config_from_args(["--out-dir", str(out), "--device=cpu", "--metrics-port=0"], env={})
    return Trainer(cfg, lambda job: None)


def test_rank_0_hosts_the_store_when_its_trainer_is_built(
    token_file: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = free_port(span=3)
    host = _trainer(0, token_file, tmp_path / "out", port, monkeypatch)
    assert host.store is not None
    t0 = time.perf_counter()
    client = dist.TCPStore("127.0.0.1", port, 2, is_master=False, timeout=timedelta(seconds=5))
    took = time.perf_counter() - t0
    client.set("k", "v")
    assert host.store.get("k") == b"v"
    assert took < 0.3, f"the first connect took {took:.2f} s: the store was not up yet"
    other = _trainer(1, token_file, tmp_path / "out", port, monkeypatch)
    assert other.store is None, "only rank 0 hosts; the others connect in their first attempt"


def test_a_run_without_a_launcher_takes_its_stores_ports_below_the_ephemeral_range(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # bind(0) handed out a base port in the ephemeral range, and base+1 (the process group's store) was
    # once held by another process's connection: EADDRINUSE beside a parallel test run.
    from trainer.resilience.timeouts import trainer_ports
    from trainer.runtime.train import _standalone_env

    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.setenv(name, "")  # recorded, so what _standalone_env sets is undone after the test
        monkeypatch.delenv(name)
    _standalone_env()
    ports = trainer_ports()
    ephemeral = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    assert int(ports.inprocess_port) < ephemeral and int(ports.pg_port) < ephemeral
    assert int(os.environ["MASTER_PORT"]) < ephemeral and ports.pg_port != ports.inprocess_port
