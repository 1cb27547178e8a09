"""Start-up checks that need the file system and the environment but no process group.

`TrainConfig.validate` checks values; this checks what the values point at: the entry point's own inputs
(its `checked_by` check; the reference model's parses its options and checks its token file), the output
and checkpoint directories are directories this process can write, every fault names a rank and node
that exist, and the metrics port is free and no store's port. It runs in `--check-config` (the pod's
init container, where a failure exits 2 and the Job fails at once) and again at every worker's start-up
(where it exits 93, ft_launcher's no-restart code), so a mistake costs one start, not a restart storm.
Each failure is a ConfigError naming the field.
"""

from __future__ import annotations

import errno
import os
import socket
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from trainer.api.check import CheckFn, World
from trainer.api.job import JobConfig
from trainer.config.inputs import bounded_seconds, check_dir_lookup, check_env
from trainer.config.train_config import ConfigError, TrainConfig
from trainer.runtime.faults import RANDOM

if TYPE_CHECKING:
    from trainer.events.metrics_server import MetricsServer

_T = TypeVar("_T")


def job_config(cfg: TrainConfig) -> JobConfig:
    """What the training function and its `checked_by` check see of `cfg` (trainer/api/job.py `JobConfig`)."""
    return JobConfig(
        entrypoint=cfg.run.entrypoint,
        args=cfg.run.entry_args,
        steps=cfg.run.steps,
        seed=cfg.run.seed,
        out_dir=cfg.run.out_dir,
        device=cfg.run.device,
        ckpt_interval=cfg.ckpt.interval_steps,
        snapshot_interval=cfg.snapshot.interval_steps,
    )


def _plain_int(value: str | None) -> int | None:
    return int(value) if value is not None and value.isascii() and value.isdigit() else None


def world_from_env(env: Mapping[str, str]) -> World:
    """Under a launcher WORLD_SIZE/GROUP_WORLD_SIZE; in the init container NNODES x NPROC_PER_NODE (the
    chart's env). NNODES=MIN:MAX (hot spares) leaves the world size unknown."""
    world, groups = _plain_int(env.get("WORLD_SIZE")), _plain_int(env.get("GROUP_WORLD_SIZE"))
    if world:
        return World(world, groups, "WORLD_SIZE")
    nnodes, nproc = _plain_int(env.get("NNODES")), _plain_int(env.get("NPROC_PER_NODE"))
    if nnodes and nproc:
        return World(nnodes * nproc, nnodes, "NNODES x NPROC_PER_NODE")
    return World(None, nnodes, "unknown")


def check_writable_dir(field: str, path: Path) -> None:
    """`path` is a directory this process can write, or can be created (its nearest existing ancestor
    is a writable directory). Writes and removes one probe file; creates nothing else."""
    try:
        if path.exists() and not path.is_dir():
            raise ConfigError(
                field,
                f"{path} exists and is not a directory; point --{field.replace('_', '-')} at a directory",
            )
        existing = path
        while not existing.exists() and existing != existing.parent:
            existing = existing.parent
    except OSError as exc:
        raise ConfigError(field, f"{path} cannot be inspected ({exc.strerror or exc})") from None
    if not existing.is_dir():
        raise ConfigError(field, f"{path} cannot be created: {existing} is a file, not a directory")
    try:
        fd, probe = tempfile.mkstemp(prefix=".trainer-write-check-", dir=existing)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        what = "is not writable" if existing == path else f"cannot be created: {existing} is not writable"
        raise ConfigError(
            field, f"{path} {what} ({exc.strerror or exc}); fix the mount or its permissions"
        ) from None


def check_dirs(cfg: TrainConfig) -> None:
    dirs = [("out_dir", cfg.run.out_dir), ("ckpt_dir", cfg.ckpt.dir)]
    if cfg.ckpt.local_dir is not None:
        dirs.append(("ckpt_local_dir", cfg.ckpt.local_dir))
    for field, path in dirs:
        check_dir_lookup(field, path)  # a symlink loop: one line, not "cannot be created" or a traceback
        check_writable_dir(field, path)
    if cfg.snapshot.enabled:
        check_dir_lookup("snapshot_dir", cfg.snapshot.dir)


def check_seconds(cfg: TrainConfig) -> None:
    """Every seconds-valued setting is at most a week (trainer/config/inputs.py MAX_SECONDS)."""
    for name, value in asdict(cfg.timeouts).items():
        if name != "hang_timeout_factor" and name != "hang_warmup_steps":
            bounded_seconds(name, value)
    bounded_seconds("metrics_linger", cfg.metrics.linger)
    bounded_seconds("ckpt_write_timeout", cfg.ckpt.write_timeout_s)


def check_fault_targets(cfg: TrainConfig, world: World) -> None:
    """Every fault targets a rank (or, for node-loss, a node) that exists, when the world is known."""
    for spec in cfg.faults.specs:
        if spec.kind == "node-loss":
            if world.nnodes is not None and spec.node >= world.nnodes:
                raise ConfigError("fault", f"{spec}: node {spec.node} does not exist ({world.nnodes} nodes)")
        elif world.world_size is not None and spec.rank != RANDOM and spec.rank >= world.world_size:
            raise ConfigError(
                "fault",
                f"{spec}: rank {spec.rank} does not exist "
                f"(world size {world.world_size}, from {world.source})",
            )


def _launcher_ports(env: Mapping[str, str]) -> dict[int, str]:
    """Ports the launcher and the trainer's stores use, as far as this environment names them."""
    ports: dict[int, str] = {}
    rdzv = _plain_int(env.get("RDZV_ENDPOINT", "").rpartition(":")[2])
    if rdzv:
        ports[rdzv] = "the rendezvous port (RDZV_ENDPOINT)"
    base = _plain_int(env.get("MASTER_PORT"))
    if base:
        ports[base] = "MASTER_PORT"
        ports[_plain_int(env.get("TRAINER_PG_PORT")) or base + 1] = "the process group's store port"
        ports[_plain_int(env.get("TRAINER_INPROCESS_PORT")) or base + 2] = (
            "the in-process Wrapper's store port"
        )
    return ports


PORT_RELEASE_WAIT_S = 3.0
"""How long a port found in use is tried again before that is a ConfigError. The previous worker's
endpoint process (trainer/events/metrics_server.py) exits when that worker dies, but a worker restarted
from the warm zygote can be checking the port a moment before it has: a taken port for good is still an
error no restart fixes (exit 93), so the wait must outlast that exit, not hide a conflict."""


def retry_while_in_use(bind: Callable[[], _T], wait_s: float = PORT_RELEASE_WAIT_S) -> _T:
    """`bind()`, tried again every 0.1 s while it fails with EADDRINUSE, for up to `wait_s`."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return bind()
        except OSError as exc:
            if exc.errno != errno.EADDRINUSE or time.monotonic() >= deadline:
                raise
        time.sleep(0.1)


def _try_bind(port: int) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the exporter's HTTP server does
        sock.bind(("0.0.0.0", port))


def check_metrics_port(
    port: int, env: Mapping[str, str], *, try_bind: bool, wait_s: float = PORT_RELEASE_WAIT_S
) -> None:
    """The exporter's port is none of the launcher's or the stores' ports and (if `try_bind`) is free,
    or freed within `wait_s`."""
    if port == 0:
        return
    taken = _launcher_ports(env)
    if port in taken:
        raise ConfigError("metrics_port", f"{port} is {taken[port]}; pick another port")
    if not try_bind:
        return
    try:
        retry_while_in_use(lambda: _try_bind(port), wait_s)
    except OSError as exc:
        raise ConfigError("metrics_port", _bind_error(port, exc)) from None


def _bind_error(port: int, exc: OSError) -> str:
    if exc.errno == errno.EADDRINUSE:
        return f"port {port} is already in use on this host; pick another --metrics-port (0 turns it off)"
    return f"cannot listen on port {port} ({exc.strerror or exc}); pick another --metrics-port"


def open_metrics_server(out_dir: Path, port: int, *, rank: int, local_rank: int) -> MetricsServer | None:
    """This node's metrics endpoint (local rank 0 serves it; 0 = off); a port taken meanwhile is a
    ConfigError, not a traceback or a silently missing endpoint."""
    if port <= 0 or local_rank != 0:
        return None
    from trainer.events.metrics_server import MetricsServer

    try:
        return retry_while_in_use(lambda: MetricsServer(out_dir, port, rank=rank))
    except OSError as exc:
        raise ConfigError("metrics_port", _bind_error(port, exc)) from None


def preflight(
    cfg: TrainConfig,
    env: Mapping[str, str] | None = None,
    *,
    check_config: bool,
    entry_check: CheckFn | None = None,
) -> World:
    """Run every check that needs no process group; raise ConfigError naming the field.

    `entry_check`: the entry point's own check of its inputs (the reference model's is
    trainer/reference/entry.py `check_reference`), run after the environment's and before the directories'.

    `check_config`: in the init container every pod tries to bind the metrics port; at start-up only
    local rank 0 does (it serves the node's endpoint; another local rank would race with it).
    """
    env = os.environ if env is None else env
    check_env(env)
    check_seconds(cfg)
    world = world_from_env(env)
    if entry_check is not None:  # the entry point's own inputs (trainer.api.checked_by)
        entry_check(job_config(cfg), world)
    check_dirs(cfg)
    check_fault_targets(cfg, world)
    # Only a starting worker waits for a port in use: its predecessor's endpoint may still be exiting.
    # The init container's check has no predecessor in the pod and answers at once.
    check_metrics_port(
        cfg.metrics.port,
        env,
        try_bind=check_config or env.get("LOCAL_RANK", "0") == "0",
        wait_s=0.0 if check_config else PORT_RELEASE_WAIT_S,
    )
    return world
