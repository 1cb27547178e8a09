"""The node-local checkpoint tier (the node's NVMe RAID, `--ckpt-local-dir`): each rank's share of a
durable checkpoint is written here first, sealed, then drained to the shared directory in the background.

    <local_dir>/step_00000041/              one per step, shared by the ranks of the node
        __<R>_0.distcp ...                  rank R's DCP shard files (the backend writes them here)
        .metadata                           the checkpoint's DCP metadata (every node gets a copy)
        rank<R>.replicated.pt               what every rank holds alike (optimizer step counters,
                                            param_groups): DCP stores those in one rank's file only
        rank<R>.json                        rank R's seal: its files with sizes and CRC32s, written last

Every file is this rank's own or written atomically with the same bytes by every rank of the node, so
the ranks of a node never coordinate here: rank R's part of a step exists exactly when its seal does.
The seal is written once every rank's write is done (an agreement of the manager), before the drain:
a crash during the drain leaves a complete local copy (and the shared directory's previous commit
untouched), and the group may restore from the local copy if every rank still has it (restore order
in trainer/recovery/restore.py). The drain re-checks each byte it copies against the sealed CRC32.

Retention is per rank, after each seal: it keeps the step just sealed and the newest keep - 1 other
sealed steps of this model, deletes this rank's parts of the rest and its unsealed leftovers older than
the step just sealed; a step directory goes when it is empty. A directory holds one run (the chart's
path ends in the run name); a seal of another model is never touched.

With a checkpoint key (`key`, trainer/security/) a seal lists SHA-256s too and is signed: a step whose
seal does not verify under the key is never offered, so nothing of it (.metadata, the replicated
values) is unpickled or loaded.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import io
import json
import os
import threading
import time
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.distributed.tensor import DTensor

from trainer.checkpoint import layout
from trainer.checkpoint.errors import CheckpointWriteError
from trainer.security.mac import check, file_digests, sign

METADATA = ".metadata"
SEAL_FORMAT = 1
_CHUNK = 8 << 20


SEAL_DOMAIN = "nvme seal v1"


@dataclass(frozen=True)
class LocalOffer:
    step: int
    path: Path
    metadata_sha256: str | None = None
    """The sealed digest of the step's .metadata: DCP unpickles only bytes with it (resume.VerifiedReader)."""


class LocalTier:
    """This rank's part of the node-local tier."""

    def __init__(self, root: Path, *, rank: int, world_size: int, keep: int) -> None:
        self.root, self.rank, self.world_size, self.keep = Path(root), rank, world_size, keep
        self.crash_after_bytes: int | None = None
        """Tests: the drain raises after copying this many bytes (a crash in the middle of a drain)."""
        self._replicated: dict[int, dict[str, Any]] = {}
        self.key: bytes | None = None
        """The checkpoint key (set by the manager): seals are signed with it and verified under it."""
        self.lineage: str | None = None
        """The checkpoint directory's lineage (trainer/checkpoint/lease.py, set by the manager): steps
        sealed under another are another run's, or of a directory since deleted: never offered, pruned."""
        self.job = ""
        self.damaged: list[tuple[int, str]] = []
        """(step, why) of each sealed step whose files failed their sealed digests (`offers`), its seal
        removed; the restore reports them (`restore_skipped`) and clears the list."""

    # ------------------------------------------------------------------------------------------ names
    def step_dir(self, step: int) -> Path:
        return self.root / layout.committed_name(step)

    def seal_path(self, step: int, rank: int | None = None) -> Path:
        return self.step_dir(step) / f"rank{self.rank if rank is None else rank}.json"

    def replicated_path(self, step: int) -> Path:
        return self.step_dir(step) / f"rank{self.rank}.replicated.pt"

    def own_files(self, directory: Path) -> list[str]:
        prefix = f"__{self.rank}_"
        try:
            with os.scandir(directory) as entries:
                return sorted(e.name for e in entries if e.name.startswith(prefix) and e.is_file())
        except FileNotFoundError:  # the node's other ranks share the folder: one may remove it meanwhile
            return []

    # ------------------------------------------------------------------------------------------ write
    def begin(self, step: int, save_dict: dict[str, Any]) -> Path:
        """The directory the backend writes this rank's shards of `step` into, cleared of this rank's
        seal and files (a rewrite of a step is never offered half-done). Keeps a copy of the save dict's
        unsharded values (small) for the seal: they change with the next optimizer step."""
        directory = self.step_dir(step)
        directory.mkdir(parents=True, exist_ok=True)
        self.seal_path(step).unlink(missing_ok=True)
        self._replicated = {step: replicated_values(save_dict)}
        for name in self.own_files(directory):
            (directory / name).unlink(missing_ok=True)
        return directory

    def seal(self, step: int, files: dict[str, Any], metadata: bytes, model_fingerprint: str) -> Path:
        """Write the checkpoint's .metadata (if this node lacks it) and this rank's seal, durably."""
        directory = self.step_dir(step)
        meta_path = directory / METADATA
        if not meta_path.is_file() or meta_path.read_bytes() != metadata:
            _write_atomic(meta_path, metadata, f".{METADATA}.rank{self.rank}.part")
        buf = io.BytesIO()
        torch.save(self._replicated.pop(step, {}), buf)
        replicated = buf.getvalue()
        _write_atomic(self.replicated_path(step), replicated, self.replicated_path(step).name + ".part")
        seal = {
            "format": SEAL_FORMAT,
            "step": step,
            "rank": self.rank,
            "world_size": self.world_size,
            layout.FINGERPRINT: model_fingerprint,
            "files": {name: files[name] for name in sorted(files)},
            "metadata": _describe(metadata),
            "replicated": _describe(replicated),
            "sealed": time.time(),
            layout.OWNER: self.job,
            layout.LINEAGE: self.lineage,
        }
        if self.key is not None:
            seal = sign(seal, self.key, SEAL_DOMAIN)
        path = self.seal_path(step)
        _write_atomic(path, json.dumps(seal, indent=1).encode(), path.name + ".part")
        return path

    def drain(self, step: int, dest: Path, files: dict[str, Any], cancel: threading.Event) -> dict[str, Any]:
        """Copy `files` ({name: {size, crc32}}) of local `step` into `dest`, checking every byte against
        the listed CRC32 (what the seal holds), each fsynced; returns the same listing for the manifest."""
        budget = [self.crash_after_bytes]
        copied: dict[str, Any] = {}
        for name in sorted(files):
            crc, sha = _copy(self.step_dir(step) / name, dest / name, cancel, budget)
            if crc != files[name]["crc32"] or files[name].get("sha256", sha) != sha:
                raise CheckpointWriteError(
                    f"rank {self.rank}: local {name} of step {step} changed after it was written "
                    f"(crc32 {crc}, expected {files[name]['crc32']})"
                )
            copied[name] = {"size": files[name]["size"], "crc32": crc, "sha256": sha}
        layout.fsync_dir(dest)
        return copied

    # ------------------------------------------------------------------------------------------- read
    def offers(self, model_fingerprint: str) -> tuple[list[LocalOffer], list[str]]:
        """This rank's sealed, verified local steps of this model, newest first; and why others were not
        offered. Verifying reads this rank's files and the .metadata (a checksum of each)."""
        good, refused = [], []
        for step in self.sealed_steps():
            reason = self._problem(step, model_fingerprint)
            if reason is None and (reason := self._content_problem(step)) is not None:
                # Bytes that no longer match the digests sealed when they were written: this rank's seal
                # goes (retention deletes the unsealed files), so no later restore verifies them again.
                self.seal_path(step).unlink(missing_ok=True)
                self.damaged.append((step, reason))
            if reason is None:
                sha = ((self._read_seal(step) or {}).get("metadata") or {}).get("sha256")
                good.append(LocalOffer(step, self.step_dir(step), sha if self.key is not None else None))
            else:
                refused.append(f"local step {step}: {reason}")
        return good, refused

    def sealed_steps(self) -> list[int]:
        """Steps with a seal of this rank (unverified), newest first."""
        if not self.root.is_dir():
            return []
        steps = []
        for entry in self.root.iterdir():
            if entry.name.startswith("step_") and (entry / f"rank{self.rank}.json").is_file():
                try:
                    steps.append(int(entry.name.removeprefix("step_")))
                except ValueError:
                    continue
        return sorted(steps, reverse=True)

    def _read_seal(self, step: int) -> dict[str, Any] | None:
        try:
            seal = json.loads(self.seal_path(step).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return seal if isinstance(seal, dict) else None

    def _problem(self, step: int, model_fingerprint: str) -> str | None:
        seal = self._read_seal(step)
        if seal is None or seal.get("format") != SEAL_FORMAT:
            return "unreadable seal"
        if self.key is not None and (bad := check(seal, self.key, SEAL_DOMAIN)) is not None:
            return f"seal {bad}"
        if seal.get("step") != step or seal.get("rank") != self.rank:
            return f"seal of step {seal.get('step')} rank {seal.get('rank')} in the wrong place"
        if self.lineage is not None and seal.get(layout.LINEAGE) != self.lineage:
            return (
                f"another run's (job {seal.get(layout.OWNER)!r}), or its checkpoint directory was "
                "deleted since: not this directory's lineage"
            )
        if seal.get("world_size") != self.world_size:
            return f"world size {seal.get('world_size')}, this run has {self.world_size}"
        if seal.get(layout.FINGERPRINT) != model_fingerprint:
            return f"another model (fingerprint {seal.get(layout.FINGERPRINT)})"
        return None

    def _content_problem(self, step: int) -> str | None:
        """Why this rank's files of a sealed step (seal checked by `_problem`) differ from it, or None."""
        seal = self._read_seal(step) or {}
        listed = {
            **seal["files"],
            METADATA: seal["metadata"],
            self.replicated_path(step).name: seal["replicated"],
        }
        directory = self.step_dir(step)
        for name, entry in sorted(listed.items()):
            try:
                if (directory / name).stat().st_size != entry["size"]:
                    return f"size mismatch in {name}"
                actual, sha = file_digests(directory / name)
            except OSError as exc:
                return f"cannot read {name}: {exc}"
            if actual != entry["crc32"]:
                return f"checksum mismatch in {name}: crc32 {actual}, sealed {entry['crc32']}"
            if self.key is not None and entry.get("sha256") != sha:
                return f"checksum mismatch in {name}: sha256 differs from the seal's"
        return None

    # ------------------------------------------------------------------------------------ maintenance
    def retain(self, model_fingerprint: str, just_sealed: int) -> list[int]:
        """Delete this rank's parts of its sealed steps of this model beyond `just_sealed` and the newest
        keep - 1 others, and its unsealed leftovers older than `just_sealed` (crashed writes); returns the
        steps it deleted from. Seals of another model are never touched."""
        others = [
            s
            for s in self.sealed_steps()
            if s != just_sealed and (self._read_seal(s) or {}).get(layout.FINGERPRINT) == model_fingerprint
        ]
        doomed = set(others[max(self.keep - 1, 0) :])
        sealed = set(self.sealed_steps())
        for entry in self.root.iterdir():
            if not entry.name.startswith("step_") or not entry.is_dir():
                continue
            try:
                step = int(entry.name.removeprefix("step_"))
            except ValueError:
                continue
            if step < just_sealed and step not in sealed and self.own_files(entry):
                doomed.add(step)
        for step in sorted(doomed):
            self._remove_own(step)
        return sorted(doomed)

    def prune_foreign(self) -> list[int]:
        """Delete this rank's parts of steps sealed under another lineage (another run's, or of a
        checkpoint directory deleted since): they are never restored. Returns those steps."""
        if self.lineage is None:
            return []
        doomed = [
            s for s in self.sealed_steps() if (self._read_seal(s) or {}).get(layout.LINEAGE) != self.lineage
        ]
        for step in doomed:
            self._remove_own(step)
        return doomed

    def load_replicated(self, step: int) -> dict[str, Any]:
        """The unsharded values sealed with `step` (verified by offers())."""
        return dict(torch.load(self.replicated_path(step), map_location="cpu", weights_only=True))

    def _remove_own(self, step: int) -> None:
        directory = self.step_dir(step)
        self.seal_path(step).unlink(missing_ok=True)  # first: never a seal over missing files
        self.replicated_path(step).unlink(missing_ok=True)
        for name in self.own_files(directory):
            (directory / name).unlink(missing_ok=True)
        try:
            rest = [p for p in directory.iterdir() if p.name != METADATA]
        except FileNotFoundError:  # another rank of the node removed the step's last part meanwhile
            return
        if not rest:  # nobody else's part left: the node's copy of this step goes
            (directory / METADATA).unlink(missing_ok=True)
            with contextlib.suppress(OSError):  # another rank of the node wrote into it meanwhile
                directory.rmdir()


def replicated_values(save_dict: dict[str, Any]) -> dict[str, Any]:
    """{flattened DCP key: copy} of every value of `save_dict` that is not a sharded DTensor."""
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict

    flat, _ = flatten_state_dict(save_dict)
    return {
        key: value.detach().to("cpu", copy=True) if isinstance(value, torch.Tensor) else copy.deepcopy(value)
        for key, value in flat.items()
        if not isinstance(value, DTensor)
    }


def _write_atomic(path: Path, data: bytes, part_name: str) -> None:
    part = path.parent / part_name
    with open(part, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(part, path)
    layout.fsync_dir(path.parent)


def _describe(data: bytes) -> dict[str, Any]:
    return {"size": len(data), "crc32": f"{zlib.crc32(data):08x}", "sha256": hashlib.sha256(data).hexdigest()}


def _copy(src: Path, dst: Path, cancel: threading.Event, budget: list[int | None]) -> tuple[str, str]:
    """Copy src to dst (fsynced), returning the CRC32 and SHA-256 of the bytes copied; stops when
    `cancel` is set."""
    crc, sha = 0, hashlib.sha256()
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        while chunk := fin.read(_CHUNK):
            if cancel.is_set():
                raise CheckpointWriteError("drain cancelled (the save was aborted)")
            if budget[0] is not None:
                if len(chunk) > budget[0]:
                    raise CheckpointWriteError(f"injected crash in the drain of {src.name}")
                budget[0] -= len(chunk)
            crc = zlib.crc32(chunk, crc)
            sha.update(chunk)
            fout.write(chunk)
        fout.flush()
        os.fsync(fout.fileno())
    return f"{crc:08x}", sha.hexdigest()
