"""The tier-1/tier-2 orchestration: `main(cfg, train)` runs once per process.

With tier 1 on, `Trainer.run_iteration` runs under the NVRx Wrapper and is re-run in the same process
after a fault; everything distributed is built inside it, held by one `Session`
(trainer/runtime/session.py), and torn down before an exception leaves it. The attempt itself is the
entry point's training function, called with a `RunningJob` (trainer/runtime/job.py, the api's `Job`
view with the step loop); the final state digest trainer/digest/state_hash.py; what an exception that
left an attempt becomes, trainer/runtime/failures.py and the branches of `main` below (exit 93, exit 1
for tier 2, re-raise for the launcher).
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import sys
import time
from typing import Any

import torch.distributed as dist

from trainer.api import rng
from trainer.api.job import TrainFn
from trainer.api.misuse import Misuse
from trainer.config.errors import EXIT_CONFIG, EXIT_NO_RESTART, UnrecoverableError, error_line
from trainer.config.train_config import TrainConfig
from trainer.events import spans
from trainer.events.metrics import EventLog, write_summary
from trainer.launcher import prefork
from trainer.resilience.guard import Guard
from trainer.resilience.timeouts import trainer_ports
from trainer.resilience.verdict import RepeatGuard
from trainer.runtime.children import kill_children
from trainer.runtime.failures import drop_frames, one_line, refused_resume
from trainer.runtime.faults import FaultInjector, resolve_ranks
from trainer.runtime.job import RunningJob, ping
from trainer.runtime.preflight import open_metrics_server
from trainer.runtime.session import ProcessInfo, Session, select_device
from trainer.snapshot.manager import Snapshots

log = logging.getLogger(__name__)


class Trainer:
    """Per-process state that outlives in-process restarts: config, events, faults, heartbeat, stores."""

    def __init__(self, cfg: TrainConfig, train: TrainFn) -> None:
        self.cfg = cfg
        self.train = train
        """The entry point's training function (trainer/api), called with a `Job` once per attempt."""
        self.job: RunningJob | None = None
        self.proc = ProcessInfo.from_env()
        self.ports = trainer_ports()
        self.device = select_device(cfg, self.proc.local_rank)
        self.metrics = open_metrics_server(
            cfg.run.out_dir, cfg.metrics.port, rank=self.proc.rank, local_rank=self.proc.local_rank
        )
        self.events = EventLog(cfg.run.out_dir, self.proc.rank)
        specs = resolve_ranks(cfg.faults.specs, self.proc.world_size, cfg.faults.seed)
        self.faults = FaultInjector(
            specs,
            rank=self.proc.rank,
            node=self.proc.node,
            marker_dir=cfg.run.out_dir / "faults",
            emit=lambda kind, step: self.events.emit("fault_injected", fault=kind, step=step),
        )
        from trainer.resilience.hangtimeout import policy_from_config
        from trainer.resilience.heartbeat import Heartbeat

        self.heartbeat = Heartbeat.from_env(policy=policy_from_config(cfg, self.proc.rank))
        self.snapshots = Snapshots.for_run(cfg, rank=self.proc.rank, world_size=self.proc.world_size)
        self.guard = Guard(cfg.guard, cfg.run.out_dir, rank=self.proc.rank)
        """The numerical guard and the run's record of skipped batches (read once per process)."""
        self.store: dist.Store | None = None
        if self.proc.rank == 0:
            # Host the training group's store now, before the in-process Wrapper's initial barrier: the
            # other ranks connect to it only after that barrier, so their first connect finds it. Hosted
            # in the first attempt instead, it came up while they were already connecting, and torch's
            # client backs off ~0.5 s after a refused connect: half a second of every tier-2 restart.
            self.base_store()
        self.caught: tuple[float, str] | None = None  # (when, why) this rank's last iteration failed
        self.failed_at = -1  # the step this rank's last iteration failed in (-1: before the first step)
        self.last_step = -1
        self.completed: tuple[str | None] | None = None
        """(final digest,) once every rank has passed the barrier after its `run_end`: the run is done."""

    def _wind_down(self) -> None:
        """A completed run's summary (rank 0) and snapshot clean-up; both idempotent."""
        if self.proc.rank == 0:
            write_summary(self.cfg.run.out_dir)
        self.snapshots.finish()

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
        if self.completed is not None:
            # The Wrapper restarted after every rank had finished training (a fault in the wind-down:
            # summary, snapshot clean-up, teardown, the completion barrier): the final state is saved and
            # its digest written, so training again would only write a second run_end.
            log.warning("in-process restart after the run completed (%s): not training again", self.caught)
            self.caught = None
            try:  # not worth failing a completed run for: logged, not raised
                self._wind_down()
            except Exception as exc:
                log.warning("wind-down after completion failed again: %s", one_line(exc))
            return self.completed[0]
        if iteration > 0:
            t_caught, reason = self.caught or (time.time(), "restarted by the in-process Wrapper")
            self.events.emit("fault_detected", tier=1, reason=reason, t_caught=t_caught)
            self.caught = None
        spans.begin()
        self.events.emit(
            "run_start", world_size=self.proc.world_size, config=self.cfg.to_dict(), forked=prefork.forked()
        )
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
                progress=lambda: ping(call_wrapper),
            )
            job = RunningJob(
                self.cfg, self.proc, session, events=self.events, faults=self.faults, guard=self.guard,
                heartbeat=self.heartbeat, call_wrapper=call_wrapper, snapshots=self.snapshots,
            )  # fmt: skip
            self.job = job
            rng.seed_all(self.cfg.run.seed, self.proc.rank)
            self.train(job)
            self.last_step = job.last_step
            if not job.finished:
                raise Misuse(
                    "entrypoint",
                    f"{self.cfg.run.entrypoint} returned before job.loop ran its last step "
                    f"({job.last_step + 1} of {self.cfg.run.steps} steps done): iterate job.loop(...) "
                    "to its end",
                )
            parts = None if job.final_digests is None else dict(job.final_digests)  # computed by job.loop
            digest = None if parts is None else parts.pop("all")
            self.events.emit(
                "run_end",
                step=self.last_step,
                status="completed",
                **({"state_sha256": digest, "state_parts": parts} if parts is not None else {}),
            )
            dist.barrier()  # every rank's run_end is written before rank 0 summarizes
            self.completed = (digest,)
            ping(call_wrapper)
            self._wind_down()
            ping(call_wrapper)
            self.job = None
            session.teardown()
            return digest
        except BaseException as exc:
            # Reported as tier 1 only if the Wrapper really starts a new iteration (Contract 3): a dead
            # peer also lands here first, but then the launcher's SIGTERM ends this process (tier 2).
            self.caught = (time.time(), one_line(exc))
            self.heartbeat.pause()  # the static hang timeout covers the restart, not the measured one
            self.failed_at = session.trainer.step + 1 if session.trainer is not None else -1
            if self.job is not None:
                self.last_step = max(self.last_step, self.job.last_step)
            self.job = None
            # The traceback's frames hold the model (and so the process group): drop them before the
            # teardown, or gloo keeps its sockets and the peers stay blocked until the collective timeout.
            drop_frames(exc)
            try:
                session.teardown()
            except BaseException as again:  # the Wrapper's asynchronous RankShouldRestart landed in it
                drop_frames(again)
                session.teardown()  # a half-done teardown keeps the sockets open: finish it
                raise
            raise


def _standalone_env() -> None:
    """Without a launcher, run as rank 0 of 1 on free local ports (the Wrapper reads RANK/WORLD_SIZE)."""
    if "RANK" in os.environ:
        return
    from trainer.runtime.ports import free_port

    # Below the ephemeral range, with base+1 and base+2 (the trainer's stores) free too: a port from
    # bind(0) had neighbours any outgoing connection could hold (EADDRINUSE, seen beside another run).
    port = free_port()
    os.environ.update(
        RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)
    )


def _exit_for_tier2(trainer: Trainer) -> None:
    """Exit now, without the interpreter's teardown, once the Wrapper handed recovery to the launcher.

    The Wrapper has shut its monitor down and nothing of this process is worth finishing, but the
    teardown (atexit hooks, freeing ~10^6 objects) takes seconds, and the launcher restarts the
    group only once every worker is gone. Exit status 1: an ordinary worker failure to the launcher.
    """
    trainer.heartbeat.stop()
    trainer.events.close()
    kill_children()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(1)


def _give_up(cfg: TrainConfig, trainer: Trainer, exc: BaseException) -> int | None:
    """The exit status, after one printed line, for a failure no restart can fix: EXIT_NO_RESTART for
    an unrecoverable error of this rank (or one a peer recorded), 1 when tier 1 gave up on a repeating
    fault (ft_launcher's turn). None for anything else: it is re-raised for the launcher to retry."""
    from trainer.resilience.verdict import record_unrecoverable, recorded_line

    gave_up = False
    if cfg.run.inprocess:
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


def main(cfg: TrainConfig, train: TrainFn) -> int:
    """Run the whole training of this process (`train` once per attempt); returns the exit status."""
    _standalone_env()
    if cfg.ckpt.mode == "nvrx":
        # First, while this process has no socket and one thread: NVRx's helpers fork from it
        # (trainer/checkpoint/helper_server.py; a worker the zygote forked has the zygote's already).
        from trainer.checkpoint import helper_server

        helper_server.start_here()
    trainer = Trainer(cfg, train)
    # Everything imported so far (torch, NVRx: ~10^6 objects) lives as long as the process. Freezing it
    # takes it out of every later collection, and a teardown's gc.collect() (which is what lets gloo
    # close its sockets, and which the Wrapper repeats between iterations) gets several times cheaper.
    gc.freeze()
    from trainer.resilience.termination import install_termination_handler

    def on_terminate(signum: int) -> None:
        trainer.events.emit("fault_detected", tier=2, reason=f"signal {signum} from the launcher")
        trainer.events.emit("run_end", step=trainer.last_step, status="failed")
        kill_children()  # the handler exits with os._exit: no exit handler shuts them down

    install_termination_handler(on_terminate)
    # Connect to the rank monitor before the first process group, model build and checkpoint load: the
    # launcher watches a rank only once it is connected, and its initial heartbeat timeout is what
    # catches a rank that hangs while starting (start() is idempotent; the loop calls it again).
    trainer.heartbeat.start()
    try:
        if cfg.run.inprocess:
            from trainer.resilience.inprocess import run_inprocess

            guard = RepeatGuard(cfg.run.max_repeated_faults)
            run_inprocess(
                trainer.run_iteration, cfg.timeouts, trainer.ports, guard, lambda: trainer.failed_at
            )
        else:
            trainer.run_iteration(None)
    except BaseException as exc:
        refused = refused_resume(exc)
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
        if cfg.run.inprocess:
            from trainer.resilience.inprocess import left_for_tier2

            left = left_for_tier2(exc)
            if left is not None:  # the Wrapper saw a dead peer before the launcher did
                # The reason is the exception that left the Wrapper: LeaveToTier2 itself when the Wrapper
                # shut down cleanly, else the error NVRx raised while shutting down.
                trainer.events.emit("fault_detected", tier=2, reason=one_line(exc))
        trainer.events.emit("run_end", step=trainer.last_step, status="failed")
        log.error("training failed: %s", one_line(exc))
        if cfg.run.inprocess and left is not None:
            _exit_for_tier2(trainer)
        raise
    finally:
        trainer.heartbeat.stop()
        trainer.events.close()
    if trainer.metrics is not None:  # a completed run: let the collector see its final figures
        trainer.metrics.linger(cfg.metrics.linger)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit("use: python -m trainer")
