"""Resume from the newest committed checkpoint that loads: every rank tries the same candidates in the
same order and reaches the same verdict on each (checksums spread over ranks, load errors agreed).

A checkpoint of another model (fingerprint) is skipped without reading it; one whose load fails is rolled
back (state.Rollback), so the next candidate, or a fresh start, begins from exactly the state the caller
built. The policy (refuse a fresh start?) is the caller's: see `RestoreResult.committed`.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import CheckpointException, FileSystemReader

from trainer.checkpoint import layout
from trainer.state.save_dict import Rollback, apply_loaded, build_load_dict

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SkippedCheckpoint:
    path: str
    reason: str


@dataclass(frozen=True)
class RestoreResult:
    step: int
    """Step of the restored checkpoint; -1 when nothing was restored."""
    path: str | None
    load_s: float
    skipped: list[SkippedCheckpoint] = field(default_factory=list)
    committed: int = 0
    """Committed checkpoints found (loadable or not): with step -1, a reason to refuse a fresh start."""


def restore_newest(
    state: dict[str, Any],
    root: Path,
    *,
    rank: int,
    world_size: int,
    group: dist.ProcessGroup,
    model_fingerprint: str,
    unloadable: set[str],
    key: bytes | None = None,
) -> RestoreResult:
    """Load the newest checkpoint under `root` that loads into `state` in place. A collective on `group`.

    Rank 0 lists the candidates (and deletes temp dirs of interrupted saves); `unloadable` collects the
    ones that failed here, so retention never counts them as kept.
    """
    t0 = time.perf_counter()
    listing: list[Any] = [None]
    if rank == 0:
        candidates, temps = layout.scan(root)
        for tmp in temps:  # never committed: garbage from an interrupted save
            layout.discard(tmp)
        listing[0] = (
            [(c.step, str(c.path), c.manifest, c.problem) for c in candidates],
            [str(t) for t in temps],
        )
    dist.broadcast_object_list(listing, src=dist.get_global_rank(group, 0), group=group)
    candidates_info, temps = listing[0]
    skipped = [SkippedCheckpoint(t, "incomplete: never committed (interrupted save)") for t in temps]
    rollback: Rollback | None = None
    for step, path_str, manifest, problem in candidates_info:
        path = Path(path_str)
        reason = (
            problem
            or (key is not None and layout.authentic(manifest, key))
            or _foreign(manifest, model_fingerprint)
            or _verify(path, manifest, rank, world_size, group)
        )
        if reason is None:
            rollback = rollback or Rollback(state)
            sha = manifest["files"][".metadata"].get("sha256") if key is not None else None
            reason = try_load(path, state, rank, world_size, group, metadata_sha256=sha)
            if reason is not None:
                rollback.restore()
        if reason is None:
            return RestoreResult(step, path_str, time.perf_counter() - t0, skipped, len(candidates_info))
        log.warning("skipping checkpoint %s: %s", path, reason)
        unloadable.add(path_str)
        skipped.append(SkippedCheckpoint(path_str, reason))
    return RestoreResult(-1, None, time.perf_counter() - t0, skipped, len(candidates_info))


def _foreign(manifest: dict[str, Any] | None, ours: str) -> str | None:
    theirs = (manifest or {}).get(layout.FINGERPRINT)
    if theirs is None:
        return None  # written before fingerprints: the load itself checks shapes
    if theirs != ours:
        return (
            f"model shape mismatch: fingerprint {theirs}, this run's model is {ours} "
            "(another preset or model change)"
        )
    return None


def _verify(
    path: Path, manifest: dict[str, Any], rank: int, world_size: int, group: dist.ProcessGroup
) -> str | None:
    """Checksums, spread over ranks; every rank gets the same verdict."""
    names = sorted(manifest["files"])[rank::world_size]
    return agree(layout.verify_checksums(path, manifest, names), world_size, group)


def try_load(
    path: Path,
    state: dict[str, Any],
    rank: int,
    world_size: int,
    group: dist.ProcessGroup,
    planner: Any = None,
    *,
    metadata_sha256: str | None = None,
) -> str | None:
    """Load the checkpoint in `path` into `state`; None, or the first rank's error on every rank.
    With `metadata_sha256`, DCP's .metadata is unpickled only from bytes with that digest (read once:
    a file swapped after the checksum pass is not loaded)."""
    error = None
    try:
        keys = set(VerifiedReader(path, metadata_sha256).read_metadata().state_dict_metadata)
        template = build_load_dict(state, rank, keys)
        reader = VerifiedReader(path, metadata_sha256)
        dcp.load(template, storage_reader=reader, planner=planner, process_group=group)
        apply_loaded(state, template, rank)
    except (Exception, CheckpointException) as exc:  # DCP's CheckpointException is a BaseException
        error = f"load failed: {type(exc).__name__}: {str(exc).strip()[:500]}"
    return agree(error, world_size, group)


class VerifiedReader(FileSystemReader):
    """DCP's file reader whose .metadata is unpickled only if its bytes have the expected SHA-256."""

    def __init__(self, path: Path, metadata_sha256: str | None) -> None:
        super().__init__(path)
        self.metadata_sha256 = metadata_sha256

    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        if self.metadata_sha256 is None:
            return super().read_metadata(*args, **kwargs)
        import hashlib
        import pickle

        from torch.distributed.checkpoint.metadata import StorageMeta

        raw = (Path(self.path) / ".metadata").read_bytes()
        if hashlib.sha256(raw).hexdigest() != self.metadata_sha256:
            raise ValueError(".metadata changed after it was verified (sha256 differs): not loaded")
        metadata = pickle.loads(raw)
        if getattr(metadata, "storage_meta", None) is None:
            metadata.storage_meta = StorageMeta()
        metadata.storage_meta.load_id = self.load_id
        return metadata


def agree(error: str | None, world_size: int, group: dist.ProcessGroup) -> str | None:
    """The first rank's error, on every rank (None when no rank had one)."""
    errors: list[Any] = [None] * world_size
    dist.all_gather_object(errors, error, group=group)
    return next((e for e in errors if e), None)
