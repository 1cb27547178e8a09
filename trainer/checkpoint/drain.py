"""The local commit of a save with a node-local tier, and the start of its drain to the shared directory.

Called by CheckpointManager._commit (all ranks, at the same call) once every rank's shards are written
and fsynced in its local step directory, with what it needs of the manager passed in as a `SealGroup`
and the save's parts as a `SaveToSeal` (this module never sees the manager):
  1. rank 0 gathers NVRx's write results and writes the DCP .metadata (nvrx mode; the other modes wrote
     it during the save), then sends its bytes to every rank;
  2. every rank writes them into its node's step directory (if missing), then its seal
     (local_tier.LocalTier.seal), and applies local retention: the step is now restorable from the
     node-local tier on this rank;
  3. every rank starts copying its files to the shared temp directory in the background (the drain).
`seal_and_drain` returns the drain's future; the manager then polls it like a write and commits in the
shared directory once every rank's drain is done: the shared directory's commit marker (its rename)
comes only after all of its bytes.

A failure before the seals raises CheckpointWriteError on every rank (the manager aborts the save, as it
does a failed write). A rank that cannot seal (a full local disk) only loses the local copy: it logs why
and drains anyway, and the group then never agrees on restoring that step from the local tier.
"""

from __future__ import annotations

import logging
import threading
import zlib
from concurrent.futures import Executor, Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch.distributed as dist

from trainer.checkpoint.errors import CheckpointWriteError
from trainer.checkpoint.local_tier import METADATA, LocalTier

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SealGroup:
    """The checkpoint manager's side of a seal: who this rank is, the group the seal agrees on, and where
    the save's pieces go."""

    rank: int
    world_size: int
    group: dist.ProcessGroup
    """The manager's gloo group (every collective of the seal runs on it)."""
    root: int
    """The global rank of the group's rank 0 (gather and broadcast root)."""
    backend: Any
    """The checkpoint backend (backends.py): `defers_metadata`, `results(token)`, `finish(token, results)`."""
    local: LocalTier
    fingerprint: str
    """The model's fingerprint (state.fingerprint): local retention keeps only this model's steps."""
    copier: Executor
    """Runs the drain in the background (the manager's one file-hashing thread)."""


@dataclass(frozen=True)
class SaveToSeal:
    """One save whose shards are written: its step, the backend's token, this rank's files (name -> size
    and CRC32) in `src` (the local step directory), the shared temp directory it drains to, and the
    event that stops a drain still copying."""

    step: int
    token: Any
    files: dict[str, Any]
    src: Path
    tmp: Path
    cancel: threading.Event


def seal_and_drain(g: SealGroup, save: SaveToSeal) -> Future[dict[str, Any]]:
    """Steps 1-3 above (a collective on `g.group`); returns the drain's future (this rank's files in the
    shared temp directory, .metadata included on rank 0). CheckpointWriteError: discarded before the seal."""
    payload: dict[str, Any] = {"results": None, "error": None}
    if g.backend.defers_metadata:
        try:
            payload["results"] = g.backend.results(save.token)
        except CheckpointWriteError as exc:
            payload["error"] = f"rank {g.rank}: {exc}"
    gathered: list[Any] | None = [None] * g.world_size if g.rank == 0 else None
    dist.gather_object(payload, gathered, dst=g.root, group=g.group)
    outcome: list[Any] = [None]
    if g.rank == 0:
        assert gathered is not None
        outcome[0] = _metadata(g, save, gathered)
    dist.broadcast_object_list(outcome, src=g.root, group=g.group)
    ok, detail = outcome[0]
    if not ok:
        raise CheckpointWriteError(
            f"checkpoint of step {save.step} failed before its seal: {detail}", save.step
        )
    metadata: bytes = detail
    files = save.files
    try:
        g.local.seal(save.step, files, metadata, g.fingerprint)
    except OSError as exc:
        log.warning(
            "local copy of step %d not sealed on rank %d (draining anyway): %s", save.step, g.rank, exc
        )
    else:
        try:
            deleted = g.local.retain(g.fingerprint, save.step)
            log.debug("local retention deleted this rank's part of steps %s", deleted)
        except OSError as exc:  # the seal stands; older parts wait for the next save's retention
            log.warning("local retention after step %d failed on rank %d: %s", save.step, g.rank, exc)
    if g.rank == 0:
        files = {**files, METADATA: {"size": len(metadata), "crc32": f"{zlib.crc32(metadata):08x}"}}
    return g.copier.submit(g.local.drain, save.step, save.tmp, files, save.cancel)


def _metadata(g: SealGroup, save: SaveToSeal, gathered: list[dict[str, Any]]) -> tuple[bool, Any]:
    """Rank 0: (True, the .metadata bytes) or (False, why not)."""
    try:
        errors = [r["error"] for r in gathered if r["error"]]
        if errors:
            raise CheckpointWriteError("; ".join(errors))
        if g.backend.defers_metadata:
            g.backend.finish(save.token, [r["results"] for r in gathered])
        return True, (save.src / METADATA).read_bytes()
    except Exception as exc:
        return False, f"{type(exc).__name__}: {exc}"
