"""A forged checkpoint is skipped and nothing of it is unpickled (docs/security.md).

The forger can write the checkpoint directory (the FSx claim, the S3 prefix) but has no checkpoint key:
it plants a newer step whose files all match its manifest (sizes, CRC32s, SHA-256s) and whose DCP
.metadata is a pickle that, once unpickled, creates a marker file. Resume must skip it with its reason
(`ckpt_skipped`) and restore the genuine older step; the marker must never appear. The same for a
manifest signed under another team's key, a genuine manifest whose .metadata was swapped, and a
forged NVMe seal.
"""

from __future__ import annotations

import json
import pickle
import shutil
from pathlib import Path
from typing import Any

import torch

from tests.trainer._ckpt import SMALL, Counter, Events
from trainer.checkpoint import CheckpointConfig, CheckpointLoop, CheckpointManager, layout
from trainer.checkpoint.local_tier import LocalTier
from trainer.reference.model import build_model
from trainer.security import keys
from trainer.security.mac import sign


class Planted:
    """Unpickling this creates `path`: the proof that a forged .metadata was loaded."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (open, (self.path, "w"))


def _state(mesh: Any, seed: int) -> dict[str, Any]:
    model = build_model(SMALL, mesh=mesh, device=torch.device("cpu"), seed=seed)
    return {"model": model, "optim": torch.optim.AdamW(model.parameters(), lr=1e-2), "trainer": Counter()}


def _forge(genuine: Path, step: int, marker: Path, *, key: bytes | None) -> Path:
    """A copy of `genuine` as `step`, with a booby-trapped .metadata and a manifest that lists every
    file's true size, CRC32 and SHA-256 (signed with `key`, or not at all)."""
    forged = genuine.parent / layout.committed_name(step)
    shutil.copytree(genuine, forged)
    (forged / ".metadata").write_bytes(pickle.dumps(Planted(str(marker))))
    manifest = json.loads((forged / layout.MANIFEST).read_text())
    manifest.pop("mac", None)
    manifest["step"] = step
    manifest["files"] = layout.describe_files(forged, sorted(manifest["files"]))
    if key is not None:
        manifest = sign(manifest, key, layout.MANIFEST_DOMAIN)
    (forged / layout.MANIFEST).write_text(json.dumps(manifest))
    return forged


def test_forged_checkpoints_are_skipped_and_never_unpickled(
    one_rank: Any, tmp_path: Path, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.delenv(keys.CKPT_KEY_ENV, raising=False)
    root = tmp_path / "ckpt"
    cfg = CheckpointConfig(dir=root, mode="sync", interval_steps=1, keep_latest=5)
    events = Events()
    manager = CheckpointManager(cfg, rank=0, world_size=1)
    loop = CheckpointLoop(manager, cfg, events, rank=0, last_step=10)
    state = _state(one_rank, seed=0)
    loop.after_step(2, state)
    loop.close()
    genuine = root / layout.committed_name(2)
    assert (tmp_path / keys.LOCAL_CKPT_KEY).stat().st_mode & 0o777 == 0o600  # the local run's key
    assert layout.authentic(json.loads((genuine / layout.MANIFEST).read_text()), manager.key) is None

    marker = tmp_path / "UNPICKLED"
    _forge(genuine, 9, marker, key=None)  # no MAC at all
    _forge(genuine, 8, marker, key=b"another team's key" * 2)  # a MAC under another key
    swapped = root / layout.committed_name(7)  # a genuine signed manifest, .metadata swapped after
    shutil.copytree(genuine, swapped)
    manifest = json.loads((genuine / layout.MANIFEST).read_text())
    (swapped / layout.MANIFEST).write_text(json.dumps(sign({**manifest, "step": 7}, manager.key,
                                                           layout.MANIFEST_DOMAIN)))  # fmt: skip
    trap = pickle.dumps(Planted(str(marker)))  # padded to the genuine size: unpickling stops at STOP
    (swapped / ".metadata").write_bytes(trap + b"\0" * ((genuine / ".metadata").stat().st_size - len(trap)))

    events = Events()
    manager = CheckpointManager(cfg, rank=0, world_size=1)
    loop = CheckpointLoop(manager, cfg, events, rank=0, last_step=10)
    fresh = _state(one_rank, seed=5)
    assert loop.restore(fresh) == 2
    loop.close()
    assert not marker.exists(), "a forged .metadata was unpickled"
    skipped = {Path(e["path"]).name: e["reason"] for e in events.of("ckpt_skipped")}
    assert "not signed" in skipped["step_00000009"], skipped
    assert "MAC does not verify" in skipped["step_00000008"], skipped
    assert "checksum mismatch in .metadata" in skipped["step_00000007"], skipped


def test_a_forged_nvme_seal_is_not_offered(tmp_path: Path) -> None:
    key = b"t" * 32
    tier = LocalTier(tmp_path / "nvme", rank=0, world_size=1, keep=2)
    tier.key = key
    directory = tier.begin(3, {})
    (directory / "__0_0.distcp").write_bytes(b"shard")
    files = layout.describe_files(directory, ["__0_0.distcp"])
    tier.seal(3, files, b"genuine metadata", "fp")
    assert [o.step for o in tier.offers("fp")[0]] == [3]

    seal = json.loads(tier.seal_path(3).read_text())
    marker = tmp_path / "UNPICKLED"
    planted = pickle.dumps(Planted(str(marker)))
    (directory / ".metadata").write_bytes(planted)
    import hashlib
    import zlib

    seal["metadata"] = {"size": len(planted), "crc32": f"{zlib.crc32(planted):08x}",
                        "sha256": hashlib.sha256(planted).hexdigest()}  # fmt: skip
    for forged in ({k: v for k, v in seal.items() if k != "mac"}, sign(seal, b"x" * 32, "nvme seal v1")):
        tier.seal_path(3).write_text(json.dumps(forged))
        offers, refused = tier.offers("fp")
        assert offers == [] and "seal" in refused[0], refused
    assert not marker.exists()
