"""Atomic, reshardable, asynchronous DCP checkpoints with keep-latest-k and resume with fallback.

- config.py:   CheckpointConfig, the one checkpoint configuration, and the CLI options made from it.
- manager.py:  CheckpointManager: save / maybe_finalize / wait / abort / restore / close, what callers hold;
               it claims the directory and composes the two halves below over one context (context.py).
- saver.py:    CheckpointSaver, the save-and-commit half: write, agree, commit atomically (the protocol).
- committed.py: CommittedCheckpoints, the restore-and-retention half: the newest that loads, retention.
- resume.py:   restore_newest: the newest committed checkpoint that loads, agreed by every rank.
- loop.py:     CheckpointLoop: the training loop's side of it (when to save, failures, resume policy).
- policy.py:   pure rules: when a pending save is polled, what retention deletes (which steps save:
               trainer/state/cadence.py).
- backends.py: how a rank writes its shards: sync (dcp.save), torch-async (dcp.async_save), nvrx (NVRx
               FileSystemWriterAsync + persistent worker; CPU workarounds in nvrx_async.py).
- nvrx_async.py: NVRx's async-checkpoint queues made safe on CPU hosts and across 0.4.1 / 0.7.x.
- helper_server.py: the pod's fork server (started by the prefork zygote) NVRx's helpers are forked from.
- layout.py:   directory names, MANIFEST.json with sizes, CRC32s and the model fingerprint, commit by
               rename, retention.
- from_snapshot.py: a save written from the snapshot of its step, in a background thread.
- lease.py:    the directory's owner: one live job per checkpoint directory, and the lineage it continues.
- errors.py:   CheckpointWriteError (a save failed), NoLoadableCheckpoint (resume refused).
- local_tier.py: the node-local tier (`local_dir`): this rank's shards written and sealed there first.
- drain.py:    the local seal of a save and the start of its drain to `dir` (committed there after it).

What a save dict holds is trainer/state/'s; which source a restarted rank restores from (this directory,
the node-local tier, a snapshot) is trainer/recovery/'s, which calls `CheckpointManager.restore` and
`load_from`. This package imports neither trainer/snapshot/ nor trainer/recovery/.

Names are imported lazily: `trainer.config.train_config` imports `trainer.checkpoint.config` while validating
the command line, which must not import torch.distributed (`--check-config` runs without a process group).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "CheckpointConfig": "trainer.checkpoint.config",
    "CheckpointWriteError": "trainer.checkpoint.errors",
    "NoLoadableCheckpoint": "trainer.checkpoint.errors",
    "CheckpointFailuresExceeded": "trainer.checkpoint.errors",
    "CheckpointHooks": "trainer.checkpoint.saver",
    "CheckpointManager": "trainer.checkpoint.manager",
    "RestoreResult": "trainer.checkpoint.resume",
    "SaveResult": "trainer.checkpoint.saver",
    "SkippedCheckpoint": "trainer.checkpoint.resume",
    "CheckpointLoop": "trainer.checkpoint.loop",
}

__all__ = sorted(_EXPORTS)
_MODULES: tuple[str, ...] = (
    "layout",
    "policy",
    "backends",
    "manager",
    "saver",
    "committed",
    "context",
    "resume",
    "loop",
    "errors",
    "config",
)
_MODULES += ("local_tier", "drain", "from_snapshot", "lease")


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    if name in _MODULES:
        return importlib.import_module(f"trainer.checkpoint.{name}")
    raise AttributeError(f"module 'trainer.checkpoint' has no attribute {name!r}")
