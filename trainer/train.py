"""The training loop: process group -> model -> optimizer -> restore -> steps -> final state hash.

`main(cfg)` runs once per process. With tier 1 on, `run_iteration` runs under the NVRx Wrapper and is
re-run in the same process after a fault; everything distributed is built inside it, held by one
`Session`, and torn down before an exception leaves it (see trainer/resilience/inprocess.py for why the
teardown is what makes gloo recovery fast).

Step numbering (shared with the event log and the checkpoints): steps are 0-based; a checkpoint is
labelled with the last step it includes; a run resumes at `restored.step + 1` (-1 = nothing restored).
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import logging
import os
import sys
import threading
import time
import traceback
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
)
from torch.distributed.checkpoint.stateful import Stateful
from torch.distributed.device_mesh import init_device_mesh

from trainer.config import TrainConfig
from trainer.data import BatchCursor, TokenDataset
from trainer.data_check import check_batch_tokens
from trainer.errors import EXIT_CONFIG, EXIT_NO_RESTART, UnrecoverableError, error_line
from trainer.faults import FaultInjector, resolve_ranks
from trainer.metrics import EventLog, write_summary
from trainer.model import build_model
from trainer.preflight import open_metrics_server
from trainer.resilience.timeouts import trainer_ports
from trainer.snapshot.config import run_fingerprint
from trainer.snapshot.manager import Snapshots
from trainer.verdict import RepeatGuard

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
    if cfg.device == "cuda" or (cfg.device == "auto" and torch.cuda.is_available()):
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
    ) -> None:
        """Process group on a fresh store prefix, FSDP2 model, optimizer, checkpoint manager, restore."""
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
        self.model = build_model(cfg.model, mesh=self.mesh, device=device, seed=cfg.seed)
        self.optim = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr)
        cursor = BatchCursor(
            TokenDataset(cfg.data_path),
            cfg.seq_len,
            cfg.micro_batch_size,
            proc.rank,
            proc.world_size,
            cfg.seed,
        )
        self.trainer = TrainerState(cursor)
        ckpt_cfg = replace(cfg.ckpt, collective_timeout_s=cfg.timeouts.collective_timeout)
        manager = CheckpointManager(
            ckpt_cfg,
            rank=proc.rank,
            world_size=proc.world_size,
            hooks=CheckpointHooks(before_commit=faults.in_checkpoint, after_write=faults.in_write),
            events=events,
        )
        self.ckpt = CheckpointLoop(manager, ckpt_cfg, events, rank=proc.rank, last_step=cfg.steps - 1)

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


def _train_steps(
    cfg: TrainConfig,
    proc: ProcessInfo,
    s: Session,
    events: EventLog,
    faults: FaultInjector,
    heartbeat: Any,
    call_wrapper: Any,
    snapshots: Snapshots,
) -> int:
    """Restore, then run the remaining steps; returns the last step done. Reads everything via `s`."""
    assert s.trainer is not None and s.model is not None and s.optim is not None
    restored = snapshots.restore(s.ckpt, s.state(), next(s.model.parameters()).device, events)
    if restored >= 0 and s.trainer.step != restored:
        raise RuntimeError(f"checkpoint of step {restored} holds trainer step {s.trainer.step}")
    heartbeat.start()

    tokens = cfg.micro_batch_size * cfg.seq_len * proc.world_size
    loss_buf = torch.zeros(1, device=next(s.model.parameters()).device)
    for step in range(s.trainer.step + 1, cfg.steps):
        faults.at_step(step, corrupt_newest=lambda: _corrupt_newest(s))
        t_start = time.time()
        inputs, targets = s.trainer.cursor.next_batch()
        check_batch_tokens(inputs, targets, cfg.model.vocab_size, step=step, path=cfg.data_path)
        device = loss_buf.device
        logits = s.model(inputs.to(device))
        loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.to(device).flatten())
        loss.backward()
        s.optim.step()
        s.optim.zero_grad(set_to_none=True)
        loss_buf.copy_(loss.detach())
        dist.all_reduce(loss_buf)  # mean loss over ranks for the log (and a per-step liveness check)
        s.trainer.step = step
        t_end = time.time()
        if proc.rank == 0:
            events.emit(
                "step",
                step=step,
                t_start=t_start,
                t_end=t_end,
                loss=loss_buf.item() / proc.world_size,
                tokens=tokens,
            )
        snap = snapshots.after_step(step, s.state())
        if snap is not None:
            events.emit("snapshot", step=step, blocked_s=snap.blocked_s, copy_s=snap.copy_s, bytes=snap.bytes)
        heartbeat.beat()
        _ping(call_wrapper)
        s.ckpt.after_step(step, s.state())
        _ping(call_wrapper)  # a save that blocked is progress too: each wait gets the whole soft timeout
    s.ckpt.finish(s.state())  # run_end follows only once the last step is committed
    _ping(call_wrapper)
    return s.trainer.step


def _ping(call_wrapper: Any) -> None:
    """Tell the in-process Wrapper that this rank made progress (its soft timeout counts from here).

    Called after each phase that may block for long (a step, a save, the final commit, the run's end):
    without it the phases add up, and a loaded machine exceeds the soft timeout on a healthy rank, which
    then restarts an iteration that had already completed (seen: two `run_end completed` in one run).
    """
    if call_wrapper is not None:
        call_wrapper.ping()


def _corrupt_newest(s: Session) -> None:
    """ckpt-corrupt: make the newest committed checkpoint unreadable (flip bytes in its largest file)."""
    # No wait() here: it is collective and only the faulting rank is in this function.
    newest = s.ckpt.latest_committed_path()
    if newest is None:
        return
    files = sorted((p for p in Path(newest).rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    if files:
        with open(files[-1], "r+b") as fh:
            size = files[-1].stat().st_size
            fh.seek(size // 2)
            chunk = fh.read(64)
            fh.seek(size // 2)
            fh.write(bytes(b ^ 0xFF for b in chunk))
            fh.flush()
            os.fsync(fh.fileno())


def state_sha256(model: torch.nn.Module, optim: torch.optim.Optimizer) -> str | None:
    """sha256 of the full (unsharded) model and optimizer state; a collective, the digest is on rank 0."""
    opts = StateDictOptions(full_state_dict=True, cpu_offload=True)
    full = {
        "model": get_model_state_dict(model, options=opts),
        "optim": get_optimizer_state_dict(model, optim, options=opts),
    }
    if dist.get_rank() != 0:
        return None
    digest = hashlib.sha256()
    _hash_into(digest, full)
    return digest.hexdigest()


def _hash_into(digest: Any, value: Any) -> None:
    if isinstance(value, dict):
        for key in sorted(value, key=str):
            digest.update(f"<{key}>".encode())
            _hash_into(digest, value[key])
    elif isinstance(value, list | tuple):
        for item in value:
            _hash_into(digest, item)
    elif isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        digest.update(f"{t.dtype}{tuple(t.shape)}".encode())
        # reshape(-1): 0-d tensors cannot be viewed as bytes
        digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    else:
        digest.update(repr(value).encode())


class Trainer:
    """Per-process state that outlives in-process restarts: config, events, faults, heartbeat, stores."""

    def __init__(self, cfg: TrainConfig) -> None:
        self.cfg = cfg
        self.proc = ProcessInfo.from_env()
        self.ports = trainer_ports()
        self.device = select_device(cfg, self.proc.local_rank)
        self.metrics = open_metrics_server(
            cfg.out_dir, cfg.metrics_port, rank=self.proc.rank, local_rank=self.proc.local_rank
        )
        self.events = EventLog(cfg.out_dir, self.proc.rank)
        specs = resolve_ranks(cfg.faults, self.proc.world_size, cfg.fault_seed)
        self.faults = FaultInjector(
            specs,
            rank=self.proc.rank,
            node=self.proc.node,
            marker_dir=cfg.out_dir / "faults",
            emit=lambda kind, step: self.events.emit("fault_injected", fault=kind, step=step),
        )
        from trainer.resilience.heartbeat import Heartbeat

        self.heartbeat = Heartbeat.from_env()
        self.snapshots = Snapshots(
            cfg.snapshot, rank=self.proc.rank, world_size=self.proc.world_size, fingerprint=_fingerprint(cfg)
        )
        self.store: dist.Store | None = None
        self.caught: tuple[float, str] | None = None  # (when, why) this rank's last iteration failed
        self.failed_at = -1  # the step this rank's last iteration failed in (-1: before the first step)
        self.last_step = -1

    def base_store(self) -> dist.Store:
        """The training PG's TCPStore (rank 0 hosts it), kept across in-process restarts."""
        if self.store is None:
            from datetime import timedelta

            self.store = dist.TCPStore(
                self.ports.host,
                self.ports.pg_port,
                self.proc.world_size,
                is_master=self.proc.rank == 0,
                timeout=timedelta(seconds=self.cfg.timeouts.inprocess_barrier_timeout),
                wait_for_workers=False,
            )
        return self.store

    def run_iteration(self, call_wrapper: Any = None) -> str | None:
        """One attempt: build, restore, train to the end; tears everything down before an exception leaves."""
        iteration = int(call_wrapper.iteration) if call_wrapper is not None else 0
        self.events.iteration = iteration
        if iteration > 0:
            t_caught, reason = self.caught or (time.time(), "restarted by the in-process Wrapper")
            self.events.emit("fault_detected", tier=1, reason=reason, t_caught=t_caught)
            self.caught = None
        self.events.emit("run_start", world_size=self.proc.world_size, config=self.cfg.to_dict())
        session = Session()
        try:
            # Fresh keys per in-process iteration: stale keys would pair new ranks with a dead
            # incarnation's. A launcher restart needs no key of its own: rank 0's new process hosts a
            # new, empty store. Nor may it have one: TORCHELASTIC_RESTART_COUNT is per agent, and a
            # replaced pod's agent starts again at 0 while the surviving pods count on.
            prefix = f"pg/i{iteration}"
            session.open(
                self.cfg,
                self.proc,
                self.events,
                self.faults,
                dist.PrefixStore(prefix, self.base_store()),
                self.device,
            )
            self.last_step = _train_steps(
                self.cfg,
                self.proc,
                session,
                self.events,
                self.faults,
                self.heartbeat,
                call_wrapper,
                self.snapshots,
            )
            assert session.model is not None and session.optim is not None
            digest = state_sha256(session.model, session.optim)
            self.events.emit(
                "run_end",
                step=self.last_step,
                status="completed",
                **({"state_sha256": digest} if digest else {}),
            )
            dist.barrier()  # every rank's run_end is written before rank 0 summarizes
            _ping(call_wrapper)
            if self.proc.rank == 0:
                write_summary(self.cfg.out_dir)
            self.snapshots.finish()
            _ping(call_wrapper)
            session.teardown()
            return digest
        except BaseException as exc:
            # Reported as tier 1 only if the Wrapper really starts a new iteration (Contract 3): a dead
            # peer also lands here first, but then the launcher's SIGTERM ends this process (tier 2).
            self.caught = (time.time(), _reason(exc))
            self.failed_at = session.trainer.step + 1 if session.trainer is not None else -1
            # The traceback's frames hold the model (and so the process group): drop them before the
            # teardown, or gloo keeps its sockets and the peers stay blocked until the collective timeout.
            _drop_frames(exc)
            try:
                session.teardown()
            except BaseException as again:  # the Wrapper's asynchronous RankShouldRestart landed in it
                _drop_frames(again)
                session.teardown()  # a half-done teardown keeps the sockets open: finish it
                raise
            raise


def _fingerprint(cfg: TrainConfig) -> str:
    """What makes a snapshot this run's: the values that decide the trajectory, and its checkpoint dir."""
    return run_fingerprint(
        {
            "preset": cfg.preset,
            "data": str(cfg.data_path.resolve()),
            "seq_len": cfg.seq_len,
            "micro_batch_size": cfg.micro_batch_size,
            "lr": cfg.lr,
            "seed": cfg.seed,
            "ckpt_dir": str(cfg.ckpt.dir.resolve()),
        }
    )


def _drop_frames(exc: BaseException) -> None:
    """Detach the tracebacks of `exc` and of the exceptions chained to it, keeping them as text (a note).

    `frame.clear()` (traceback.clear_frames) drops a frame's locals but not the function it runs, and
    `Module._call_impl`'s `inner` is a closure over the module: a collective that failed inside a forward
    hook leaves a traceback that holds the whole FSDP model, so its process group. NVRx keeps the
    exception (`state.fn_exception`) until after its iteration barrier; a peer blocked in a collective
    with this rank (one not connected to the faulting rank) would then wait for the collective timeout.
    """
    seen: set[int] = set()
    pending: list[BaseException | None] = [exc]
    while pending:
        e = pending.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        tb = e.__traceback__
        if tb is not None:
            e.add_note(
                "Traceback (frames dropped to release the process group):\n"
                + "".join(traceback.format_tb(tb))
            )
            traceback.clear_frames(tb)
            e.__traceback__ = None
        pending += [e.__cause__, e.__context__]


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300] if text else ''}"


def _refused_resume(exc: BaseException) -> BaseException | None:
    """The NoLoadableCheckpoint behind `exc` (the in-process Wrapper may wrap it), if any."""
    from trainer.checkpoint.errors import NoLoadableCheckpoint

    seen: set[int] = set()
    pending: list[BaseException | None] = [exc]
    while pending:
        e = pending.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, NoLoadableCheckpoint):
            return e
        pending += [e.__cause__, e.__context__]
    return None


def _standalone_env() -> None:
    """Without a launcher, run as rank 0 of 1 on free local ports (the Wrapper reads RANK/WORLD_SIZE)."""
    if "RANK" in os.environ:
        return
    import socket

    with socket.socket() as sock:  # a free base port; the trainer's stores take base+1 and base+2
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    os.environ.update(
        RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )


def _exit_for_tier2(trainer: Trainer) -> None:
    """Exit now, without the interpreter's teardown, once the Wrapper handed recovery to the launcher.

    The Wrapper has shut its monitor down and nothing of this process is worth finishing, but the
    teardown (atexit hooks, freeing ~10^6 objects) took 3.3 s here, and the launcher restarts the
    group only once every worker is gone. Exit status 1: an ordinary worker failure to the launcher.
    """
    trainer.heartbeat.stop()
    trainer.events.close()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(1)


def _give_up(cfg: TrainConfig, trainer: Trainer, exc: BaseException) -> int | None:
    """The exit status, after one printed line, for a failure no restart can fix: EXIT_NO_RESTART for
    an unrecoverable error of this rank (or one a peer recorded), 1 when tier 1 gave up on a repeating
    fault (ft_launcher's turn). None for anything else: it is re-raised for the launcher to retry."""
    from trainer.verdict import record_unrecoverable, recorded_line

    gave_up = False
    if cfg.inprocess:
        from trainer.resilience.inprocess import GiveUp

        gave_up = isinstance(exc, GiveUp)
    cause = (getattr(exc, "error", None) or exc.__cause__) if gave_up else exc
    if isinstance(cause, UnrecoverableError):
        record_unrecoverable(sys.argv[1:], cause, trainer.proc.rank, os.environ)
        print(error_line(cause), file=sys.stderr, flush=True)
        return EXIT_NO_RESTART
    if gave_up:
        print(str(exc), file=sys.stderr, flush=True)
        return 1
    line = recorded_line(sys.argv[1:], os.environ)
    if line is not None:  # a peer stopped on an unrecoverable error: this rank leaves with it
        print(line, file=sys.stderr, flush=True)
        return EXIT_NO_RESTART
    return None


def main(cfg: TrainConfig) -> int:
    """Run the whole training of this process; returns the exit status."""
    _standalone_env()
    trainer = Trainer(cfg)
    # Everything imported so far (torch, NVRx: ~10^6 objects) lives as long as the process. Freezing it
    # takes it out of every later collection, and a teardown's gc.collect() (which is what lets gloo
    # close its sockets, and which the Wrapper repeats between iterations) gets several times cheaper.
    gc.freeze()
    from trainer.resilience.termination import install_termination_handler

    def on_terminate(signum: int) -> None:
        trainer.events.emit("fault_detected", tier=2, reason=f"signal {signum} from the launcher")
        trainer.events.emit("run_end", step=trainer.last_step, status="failed")

    install_termination_handler(on_terminate)
    # Connect to the rank monitor before the first process group, model build and checkpoint load: the
    # launcher watches a rank only once it is connected, and its initial heartbeat timeout is what
    # catches a rank that hangs while starting (start() is idempotent; the loop calls it again).
    trainer.heartbeat.start()
    try:
        if cfg.inprocess:
            from trainer.resilience.inprocess import run_inprocess

            guard = RepeatGuard(cfg.max_repeated_faults)
            run_inprocess(
                trainer.run_iteration, cfg.timeouts, trainer.ports, guard, lambda: trainer.failed_at
            )
        else:
            trainer.run_iteration(None)
    except BaseException as exc:
        refused = _refused_resume(exc)
        if refused is not None and "TORCHELASTIC_RUN_ID" not in os.environ:
            # A plain run: no launcher to classify it, so say why in one line per checkpoint and exit 2.
            print(refused, file=sys.stderr)
            trainer.events.emit("run_end", step=trainer.last_step, status="failed")
            return EXIT_CONFIG
        status = _give_up(cfg, trainer, exc)
        if status is not None:
            trainer.events.emit("run_end", step=trainer.last_step, status="failed")
            return status
        left = None
        if cfg.inprocess:
            from trainer.resilience.inprocess import left_for_tier2

            left = left_for_tier2(exc)
            if left is not None:  # the Wrapper saw a dead peer before the launcher did
                # The reason is the exception that left the Wrapper: LeaveToTier2 itself when the Wrapper
                # shut down cleanly, else the error NVRx raised while shutting down.
                trainer.events.emit("fault_detected", tier=2, reason=_reason(exc))
        trainer.events.emit("run_end", step=trainer.last_step, status="failed")
        log.error("training failed: %s", _reason(exc))
        if cfg.inprocess and left is not None:
            _exit_for_tier2(trainer)
        raise
    finally:
        trainer.heartbeat.stop()
        trainer.events.close()
    if trainer.metrics is not None:  # a completed run: let the collector see its final figures
        trainer.metrics.linger(cfg.metrics_linger)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit("use: python -m trainer")
