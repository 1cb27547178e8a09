"""The step loop of one (re)start: restore (snapshot or checkpoint, agreed by every rank), then forward,
backward and optimizer step per step, the per-step event, snapshot, heartbeat and checkpoint calls.

Step numbering (shared with the event log and the checkpoints): steps are 0-based; a checkpoint is
labelled with the last step it includes; a run resumes at `restored.step + 1` (-1 = nothing restored).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from trainer.config import TrainConfig
from trainer.data_check import check_batch_tokens
from trainer.faults import FaultInjector
from trainer.metrics import EventLog
from trainer.session import ProcessInfo, Session
from trainer.snapshot.manager import Snapshots


def train_steps(
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

    tokens = cfg.data.micro_batch_size * cfg.data.seq_len * proc.world_size
    loss_buf = torch.zeros(1, device=next(s.model.parameters()).device)
    for step in range(s.trainer.step + 1, cfg.run.steps):
        faults.at_step(step, corrupt_newest=lambda: corrupt_newest(s))
        t_start = time.time()
        inputs, targets = s.trainer.cursor.next_batch()
        check_batch_tokens(inputs, targets, cfg.arch.vocab_size, step=step, path=cfg.data.path)
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
        ping(call_wrapper)
        s.ckpt.after_step(step, s.state())
        ping(call_wrapper)  # a save that blocked is progress too: each wait gets the whole soft timeout
    heartbeat.pause()  # no more steps: the final commit and the run's end are judged by the static timeout
    s.ckpt.finish(s.state())  # run_end follows only once the last step is committed
    ping(call_wrapper)
    return s.trainer.step


def ping(call_wrapper: Any) -> None:
    """Tell the in-process Wrapper that this rank made progress (its soft timeout counts from here).

    Called after each phase that may block for long (a step, a save, the final commit, the run's end):
    without it the phases add up, and a loaded machine exceeds the soft timeout on a healthy rank, which
    then restarts an iteration that had already completed (seen: two `run_end completed` in one run).
    """
    if call_wrapper is not None:
        call_wrapper.ping()


def corrupt_newest(s: Session) -> None:
    """ckpt-corrupt: make the newest committed checkpoint unreadable (flip bytes in its largest file),
    in both tiers: the node-local copy of that file too, if this node has it."""
    # No wait() here: it is collective and only the faulting rank is in this function.
    newest = s.ckpt.latest_committed_path()
    if newest is None:
        return
    files = sorted((p for p in Path(newest).rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    if not files:
        return
    targets = [files[-1]]
    local = s.ckpt.manager.local
    if local is not None:
        targets.append(local.root / Path(newest).name / files[-1].name)
    for target in targets:
        if target.is_file():
            _flip_middle(target)


def _flip_middle(path: Path) -> None:
    with open(path, "r+b") as fh:
        size = path.stat().st_size
        fh.seek(size // 2)
        chunk = fh.read(64)
        fh.seek(size // 2)
        fh.write(bytes(b ^ 0xFF for b in chunk))
        fh.flush()
        os.fsync(fh.fileno())
