"""On-disk layout of checkpoints: names, manifest, checksums, commit by rename, retention.

    <dir>/step_00000041/            a committed checkpoint: DCP shard files, .metadata, MANIFEST.json
    <dir>/.tmp-step_00000049/       a save in progress (or the leftover of a crashed one): never loaded
    <dir>/.trash-step_00000011/     a checkpoint being deleted by retention: never loaded

A checkpoint becomes visible in one atomic step, the rename of its temporary directory to `step_<N>`,
and only after every file in it (listed with size and CRC32 in MANIFEST.json) has been fsynced. A reader
therefore never sees a half-written checkpoint; one damaged afterwards (bit rot, a truncated copy, the
ckpt-corrupt fault) fails the manifest check and is skipped with the reason.

A manifest also lists each file's SHA-256, names the run that owns it (`owner`, trainer/checkpoint/
lease.py) and is signed with HMAC-SHA256 under the team's checkpoint key (trainer/security/): resume
loads nothing of a checkpoint, not even DCP's pickled .metadata, before the signature and every file's
digest verify (docs/security.md).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from trainer.security.mac import check, file_digests, sign

MANIFEST = "MANIFEST.json"
FINGERPRINT = "model_fingerprint"
"""Manifest key: a hash of the model's parameter names, global shapes and dtypes (state.fingerprint)."""
OWNER = "owner"
"""Manifest key: the job uid of the run that committed it (retention touches only its own)."""
LINEAGE = "lineage"
"""Manifest key: the lineage of the directory's lease when it was committed (lease.py)."""
MANIFEST_DOMAIN = "checkpoint manifest v1"
FORMAT_VERSION = 1
_COMMITTED = re.compile(r"^step_(\d{8,})$")


def committed_name(step: int) -> str:
    return f"step_{step:08d}"


def temp_name(step: int) -> str:
    return f".tmp-{committed_name(step)}"


def describe_files(directory: Path, names: list[str]) -> dict[str, dict[str, Any]]:
    """{name: {"size", "crc32", "sha256"}} for the given files of `directory` (one read of each)."""
    described = {}
    for name in sorted(names):
        crc, sha = file_digests(directory / name)
        described[name] = {"size": (directory / name).stat().st_size, "crc32": crc, "sha256": sha}
    return described


def fsync_dir(path: Path) -> None:
    """Make a directory's entries (creations, renames) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_files(directory: Path, names: list[str]) -> None:
    for name in names:
        with open(directory / name, "rb") as fh:
            os.fsync(fh.fileno())


def commit(
    tmp: Path, step: int, files: dict[str, dict[str, Any]], extra: dict[str, Any], *, key: bytes | None = None
) -> Path:
    """Write the manifest into `tmp` (signed with `key`; a file listed without its SHA-256 is read for
    it), make it durable, and rename `tmp` to its committed name."""
    if key is not None:
        files = {
            name: entry if "sha256" in entry else {**entry, "sha256": file_digests(tmp / name)[1]}
            for name, entry in files.items()
        }
    manifest: dict[str, Any] = {
        "format": FORMAT_VERSION,
        "step": step,
        "created": time.time(),
        "files": files,
        "total_bytes": sum(int(f["size"]) for f in files.values()),
        **extra,
    }
    if key is not None:
        manifest = sign(manifest, key, MANIFEST_DOMAIN)
    part = tmp / (MANIFEST + ".part")
    with open(part, "w", encoding="utf-8") as fh:
        json.dump(manifest, fh, indent=1, sort_keys=True)
        fh.flush()
        os.fsync(fh.fileno())
    part.rename(tmp / MANIFEST)
    fsync_dir(tmp)
    final = tmp.parent / committed_name(step)
    if final.exists():
        theirs = _lineage_of(final)
        if extra.get(LINEAGE) and theirs is not None and theirs != extra[LINEAGE]:
            raise OSError(f"{final} belongs to another run (lineage {theirs}): not replaced")
        # A checkpoint of the same step from an earlier incarnation (resumed before it, then redone):
        # move it aside first; the new one has the same content by exact-resume determinism.
        _discard(final)
    tmp.rename(final)
    fsync_dir(tmp.parent)
    return final


def _lineage_of(path: Path) -> str | None:
    try:
        manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return manifest.get(LINEAGE) if isinstance(manifest, dict) else None


@dataclass(frozen=True)
class Candidate:
    """A committed checkpoint directory and what its manifest says (None when unreadable)."""

    step: int
    path: Path
    manifest: dict[str, Any] | None
    problem: str | None


def scan(root: Path) -> tuple[list[Candidate], list[Path]]:
    """Committed checkpoints, newest first, each pre-checked (manifest, presence, sizes), and temp dirs."""
    if not root.is_dir():
        return [], []
    candidates, temps = [], []
    for entry in root.iterdir():
        if entry.name.startswith(".tmp-") and entry.is_dir():
            temps.append(entry)
            continue
        match = _COMMITTED.match(entry.name)
        if match and entry.is_dir():
            manifest, problem = _precheck(entry, int(match.group(1)))
            candidates.append(Candidate(int(match.group(1)), entry, manifest, problem))
    candidates.sort(key=lambda c: c.step, reverse=True)
    return candidates, sorted(temps)


def _precheck(path: Path, step: int) -> tuple[dict[str, Any] | None, str | None]:
    try:
        manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None, "no manifest (incomplete checkpoint)"
    except (OSError, ValueError) as exc:
        return None, f"unreadable manifest: {exc}"
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_VERSION:
        return (
            None,
            f"unsupported manifest format {manifest.get('format') if isinstance(manifest, dict) else '?'}",
        )
    if manifest.get("step") != step:
        return None, f"manifest step {manifest.get('step')} does not match directory {path.name}"
    files = manifest.get("files")
    if not isinstance(files, dict) or ".metadata" not in files:
        return None, "manifest lists no DCP .metadata"
    for name, entry in files.items():
        try:
            size = (path / name).stat().st_size
        except FileNotFoundError:
            return manifest, f"missing file {name}"
        if size != entry.get("size"):
            return manifest, f"size mismatch in {name}: {size} bytes, manifest says {entry.get('size')}"
    return manifest, None


def authentic(manifest: dict[str, Any], key: bytes) -> str | None:
    """None if the manifest is signed under `key` and lists a SHA-256 for every file, else why not."""
    problem = check(manifest, key, MANIFEST_DOMAIN)
    if problem is not None:
        return f"manifest {problem}"
    unhashed = sorted(n for n, e in manifest["files"].items() if not isinstance(e, dict) or "sha256" not in e)
    return f"manifest lists no SHA-256 for {', '.join(unhashed[:3])}" if unhashed else None


def verify_checksums(path: Path, manifest: dict[str, Any], names: list[str]) -> str | None:
    """None if the listed files match their manifest CRC32 (and SHA-256, when listed), else the first
    mismatch."""
    for name in names:
        entry = manifest["files"][name]
        try:
            crc, sha = file_digests(path / name)
        except OSError as exc:
            return f"cannot read {name}: {exc}"
        if crc != entry["crc32"]:
            return f"checksum mismatch in {name}: crc32 {crc}, manifest says {entry['crc32']}"
        if "sha256" in entry and sha != entry["sha256"]:
            return f"checksum mismatch in {name}: sha256 differs from the manifest's"
    return None


def _discard(path: Path) -> None:
    """Delete a directory so that it is never seen half-deleted under a loadable name."""
    trash = path.parent / f".trash-{path.name}-{os.getpid()}-{time.monotonic_ns()}"
    path.rename(trash)
    shutil.rmtree(trash, ignore_errors=True)


def discard(path: Path) -> None:
    """Remove a temp or committed checkpoint directory (rename first, then delete)."""
    if path.exists():
        _discard(path)


def apply_retention(
    root: Path,
    keep: int,
    *,
    just_committed: Path,
    fingerprint: str,
    unloadable: Iterable[str] = (),
    lineage: str | None = None,
) -> list[Path]:
    """Delete what policy.to_delete names (never the checkpoint just committed, never one not provably
    this model's, never one that does not load, and with `lineage` never one another run committed:
    lease.py); returns what was deleted."""
    from trainer.checkpoint.policy import Kept, to_delete

    candidates, _ = scan(root)
    bad = {str(p) for p in unloadable}
    kept = [
        Kept(
            c.step,
            c.path,
            ours=c.manifest is not None
            and c.manifest.get(FINGERPRINT) == fingerprint
            and (lineage is None or c.manifest.get(LINEAGE) == lineage),
            loadable=c.problem is None and str(c.path) not in bad,
        )
        for c in candidates
    ]
    doomed = to_delete(kept, just_committed, keep)
    for path in doomed:
        discard(path)
    for leftover in root.glob(".trash-*"):  # from a process killed while deleting
        shutil.rmtree(leftover, ignore_errors=True)
    return doomed
