"""One (re)start's distributed objects: where this process sits in the job, the trainer's own state, and
the `Session` that builds the process group, FSDP2 model, optimizer and checkpoint loop and tears them
all down at once (see trainer/resilience/inprocess.py for why the teardown is what makes gloo recovery
fast).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.stateful import Stateful
from torch.distributed.device_mesh import init_device_mesh

from trainer.config import TrainConfig
from trainer.data import BatchCursor, TokenDataset
from trainer.faults import FaultInjector
from trainer.metrics import EventLog
from trainer.model import build_model

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ProcessInfo:
    """Where this process sits in the job, from the launcher's environment (torchrun/ft_launcher)."""

    rank: int
    world_size: int
    local_rank: int
    node: int
    restart: int

    @classmethod
    def from_env(cls) -> ProcessInfo:
        env = os.environ
        return cls(
            rank=int(env.get("RANK", "0")),
            world_size=int(env.get("WORLD_SIZE", "1")),
            local_rank=int(env.get("LOCAL_RANK", "0")),
            node=int(env.get("GROUP_RANK", "0")),
            restart=int(env.get("TORCHELASTIC_RESTART_COUNT", "0")),
        )


class TrainerState(Stateful):
    """What the checkpoint holds besides model and optimizer: last step done, data cursor, RNG."""

    def __init__(self, cursor: BatchCursor) -> None:
        self.step = -1
        self.cursor = cursor

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "data": self.cursor.state_dict(), "rng": torch.get_rng_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])
        self.cursor.load_state_dict(state["data"])
        torch.set_rng_state(state["rng"])


def select_device(cfg: TrainConfig, local_rank: int) -> torch.device:
    if cfg.run.device == "cuda" or (cfg.run.device == "auto" and torch.cuda.is_available()):
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


class Session:
    """The distributed objects of one (re)start: built by `open`, dropped all at once by `teardown`.

    Nothing else may keep a reference to the process group, the mesh or the model: gloo closes its
    sockets (which is what unblocks peers at once) only when the last reference is gone.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.model: torch.nn.Module | None = None
        self.optim: torch.optim.Optimizer | None = None
        self.ckpt: Any = None
        self.trainer: TrainerState | None = None
        self.mesh: Any = None

    def open(
        self,
        cfg: TrainConfig,
        proc: ProcessInfo,
        events: EventLog,
        faults: FaultInjector,
        store: dist.Store,
        device: torch.device,
        progress: Callable[[], None] | None = None,
    ) -> None:
        """Process group on a fresh store prefix, FSDP2 model, optimizer, checkpoint manager, restore.

        `progress` is called between the rounds of a blocking checkpoint wait (the trainer pings the
        in-process Wrapper from it: a long final write must not look like a hung rank)."""
        from datetime import timedelta

        from trainer.checkpoint import CheckpointHooks, CheckpointLoop, CheckpointManager

        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(
            backend,
            store=store,
            rank=proc.rank,
            world_size=proc.world_size,
            timeout=timedelta(seconds=cfg.timeouts.collective_timeout),
            device_id=device if device.type == "cuda" else None,
        )
        self.mesh = init_device_mesh(device.type, (proc.world_size,))
        self.model = build_model(cfg.arch, mesh=self.mesh, device=device, seed=cfg.run.seed)
        self.optim = torch.optim.AdamW(self.model.parameters(), lr=cfg.run.lr)
        cursor = BatchCursor(
            TokenDataset(cfg.data.path),
            cfg.data.seq_len,
            cfg.data.micro_batch_size,
            proc.rank,
            proc.world_size,
            cfg.run.seed,
        )
        self.trainer = TrainerState(cursor)
        manager = CheckpointManager(
            cfg.ckpt,
            rank=proc.rank,
            world_size=proc.world_size,
            hooks=CheckpointHooks(
                before_commit=faults.in_checkpoint, after_write=faults.in_write, progress=progress
            ),
            events=events,
        )
        self.ckpt = CheckpointLoop(manager, cfg.ckpt, events, rank=proc.rank, last_step=cfg.run.steps - 1)

    def state(self) -> dict[str, Any]:
        return {"model": self.model, "optim": self.optim, "trainer": self.trainer}

    def teardown(self) -> None:
        """Close the checkpoint manager, drop every reference, destroy the process group. Idempotent."""
        with self.lock:
            t0 = time.perf_counter()
            if self.ckpt is not None:
                try:
                    self.ckpt.close()
                except Exception as exc:  # a failed background write must not block recovery
                    log.warning("checkpoint manager close failed during teardown: %s", exc)
            t1 = time.perf_counter()
            from trainer.resilience.inprocess import destroy_all_process_groups, release_mesh_groups

            if self.mesh is not None:
                release_mesh_groups(self.mesh)
            self.model = self.optim = self.ckpt = self.trainer = self.mesh = None
            # The collection in there matters: FSDP hooks form reference cycles, and the group (with
            # its sockets) dies only when they are collected.
            destroy_all_process_groups(collect=True)
            log.info("teardown: ckpt close %.3f s, groups %.3f s", t1 - t0, time.perf_counter() - t1)
