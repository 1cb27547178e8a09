"""The local commit of a save with a node-local tier, and the start of its drain to the shared directory.

Called by CheckpointManager._commit (all ranks, at the same call) once every rank's shards are written
and fsynced in its local step directory:
  1. rank 0 gathers NVRx's write results and writes the DCP .metadata (nvrx mode; the other modes wrote
     it during the save), then sends its bytes to every rank;
  2. every rank writes them into its node's step directory (if missing), then its seal
     (local_tier.LocalTier.seal), and applies local retention: the step is now restorable from the
     node-local tier on this rank;
  3. every rank starts copying its files to the shared temp directory in the background (the drain).
The manager then polls the drain like a write and commits in the shared directory once every rank's
drain is done: the shared directory's commit marker (its rename) comes only after all of its bytes.

A failure before the seals raises CheckpointWriteError on every rank (the save is discarded, as a failed
write would be). A rank that cannot seal (a full local disk) only loses the local copy: it logs why and
drains anyway, and the group then never agrees on restoring that step from the local tier.
"""

from __future__ import annotations

import logging
import zlib
from typing import TYPE_CHECKING, Any

import torch.distributed as dist

from trainer.checkpoint.errors import CheckpointWriteError
from trainer.checkpoint.local_tier import METADATA

if TYPE_CHECKING:
    from trainer.checkpoint.manager import CheckpointManager, _Pending

log = logging.getLogger(__name__)


def seal_and_drain(m: CheckpointManager, p: _Pending) -> None:
    local = m.local
    assert local is not None and p.files is not None and p.src is not None
    files: dict[str, Any] = p.files.result()
    payload: dict[str, Any] = {"results": None, "error": None}
    if m._backend.defers_metadata:
        try:
            payload["results"] = m._backend.results(p.token)
        except CheckpointWriteError as exc:
            payload["error"] = f"rank {m.rank}: {exc}"
    gathered: list[Any] | None = [None] * m.world_size if m.rank == 0 else None
    root = m._global_rank0()
    dist.gather_object(payload, gathered, dst=root, group=m._group())
    outcome: list[Any] = [None]
    if m.rank == 0:
        assert gathered is not None
        outcome[0] = _metadata(m, p, gathered)
    dist.broadcast_object_list(outcome, src=root, group=m._group())
    ok, detail = outcome[0]
    if not ok:
        m.abort()
        raise CheckpointWriteError(f"checkpoint of step {p.step} failed before its seal: {detail}", p.step)
    metadata: bytes = detail
    assert m._fingerprint is not None
    try:
        local.seal(p.step, files, metadata, m._fingerprint)
        deleted = local.retain(m._fingerprint, p.step)
        log.debug("local retention deleted this rank's part of steps %s", deleted)
    except OSError as exc:
        log.warning("local copy of step %d not sealed on rank %d (draining anyway): %s", p.step, m.rank, exc)
    if m.rank == 0:
        files = {**files, METADATA: {"size": len(metadata), "crc32": f"{zlib.crc32(metadata):08x}"}}
    p.phase, p.calls = "drain", 0
    p.files = m._hasher.submit(local.drain, p.step, p.tmp, files, p.cancel)


def _metadata(m: CheckpointManager, p: _Pending, gathered: list[dict[str, Any]]) -> tuple[bool, Any]:
    """Rank 0: (True, the .metadata bytes) or (False, why not)."""
    assert p.src is not None
    try:
        errors = [g["error"] for g in gathered if g["error"]]
        if errors:
            raise CheckpointWriteError("; ".join(errors))
        if m._backend.defers_metadata:
            m._backend.finish(p.token, [g["results"] for g in gathered])
        return True, (p.src / METADATA).read_bytes()
    except Exception as exc:
        return False, f"{type(exc).__name__}: {exc}"
