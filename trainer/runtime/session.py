"""One (re)start's distributed objects: where this process sits in the job, and the `Session` that builds
the process group, mesh and checkpoint loop, holds what the training function built (FSDP2 model,
optimizer, state) and tears them all down at once (see trainer/resilience/inprocess.py for why the
teardown is what makes gloo recovery fast).
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
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from trainer.config.train_config import TrainConfig
from trainer.events.metrics import EventLog
from trainer.runtime.faults import FaultInjector

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
        self.ckpt: Any = None
        self.entries: dict[str, Any] = {}
        """What the training function built, by checkpoint name (trainer/runtime/job.py `RunningJob.loop`):
        model, optim, trainer (the loop's own state: last step, data position, RNG), scheduler, the team's."""
        self.mesh: DeviceMesh | None = None
        self.extra_meshes: list[DeviceMesh] = []
        self.device: torch.device | None = None
        self.known_groups: set[int] = set()

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
        """Process group on a fresh store prefix, the 1-D mesh, the checkpoint manager and loop.

        The training function builds the model, optimizer and data and hands them over in `attach`.
        `progress` is called between the rounds of a blocking checkpoint wait (the trainer pings the
        in-process Wrapper from it: a long final write must not look like a hung rank)."""
        from datetime import timedelta

        from trainer.api.misuse import process_groups
        from trainer.checkpoint import CheckpointHooks, CheckpointLoop, CheckpointManager
        from trainer.events import spans

        spans.mark("store")
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(
            backend,
            store=store,
            rank=proc.rank,
            world_size=proc.world_size,
            timeout=timedelta(seconds=cfg.timeouts.collective_timeout),
            device_id=device if device.type == "cuda" else None,
        )
        spans.mark("pg")
        self.device = device
        self.mesh = init_device_mesh(device.type, (proc.world_size,))
        spans.mark("mesh")
        manager = CheckpointManager(
            cfg.ckpt,
            rank=proc.rank,
            world_size=proc.world_size,
            hooks=CheckpointHooks(
                before_commit=faults.in_checkpoint, after_write=faults.in_write, progress=progress
            ),
            events=events,
            commit_in_background=True,  # the loop's step boundaries wait for no save's commit
            # NVRx's worker starts after the first step, not beside the restore; with snapshots a save due
            # before it is up is written from its snapshot in this process (without, it would wait for it)
            start_writers_later=cfg.snapshot.enabled,
        )
        self.ckpt = CheckpointLoop(manager, cfg.ckpt, events, rank=proc.rank, last_step=cfg.run.steps - 1)
        self.known_groups = process_groups()
        spans.mark("ckpt_manager")

    def extra_mesh(self, shape: tuple[int, ...], names: tuple[str, ...]) -> DeviceMesh:
        """A DeviceMesh of more dimensions, known to the teardown (`job.device_mesh`)."""
        from trainer.api.misuse import process_groups

        assert self.device is not None
        mesh = init_device_mesh(self.device.type, shape, mesh_dim_names=names)
        self.extra_meshes.append(mesh)
        self.known_groups |= process_groups()
        return mesh

    @property
    def model(self) -> torch.nn.Module | None:
        return self.entries.get("model")

    @property
    def optim(self) -> torch.optim.Optimizer | None:
        return self.entries.get("optim")

    @property
    def trainer(self) -> Any:
        """The loop's own state (trainer/runtime/job.py LoopState), None before `job.loop`."""
        return self.entries.get("trainer")

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

            for mesh in (self.mesh, *self.extra_meshes):
                if mesh is not None:
                    release_mesh_groups(mesh)
            self.ckpt = self.mesh = None
            self.entries, self.extra_meshes = {}, []
            # The collection in there matters: FSDP hooks form reference cycles, and the group (with
            # its sockets) dies only when they are collected.
            destroy_all_process_groups(collect=True)
            log.info("teardown: ckpt close %.3f s, groups %.3f s", t1 - t0, time.perf_counter() - t1)
