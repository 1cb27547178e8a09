"""Atomic, reshardable, asynchronous DCP checkpoints with keep-latest-k and resume with fallback.

- config.py:   CheckpointConfig (validated).
- manager.py:  CheckpointManager: save / maybe_finalize / wait / load_latest / close, the commit protocol.
- backends.py: how a rank writes its shards: sync (dcp.save), torch-async (dcp.async_save), nvrx (NVRx
               FileSystemWriterAsync + persistent worker; CPU workarounds in trainer/resilience/compat.py).
- layout.py:   directory names, MANIFEST.json with sizes and CRC32s, commit by rename, retention.
- state.py:    the loop's objects <-> a DCP state dict (FSDP2 DTensor shards; per-rank trainer state).

Not implemented: the node-local tier (`local_dir` is accepted and ignored; every save goes to `dir`).
"""

from trainer.checkpoint.backends import CheckpointWriteError
from trainer.checkpoint.config import CheckpointConfig
from trainer.checkpoint.manager import (
    CheckpointHooks,
    CheckpointManager,
    RestoreResult,
    SaveResult,
    SkippedCheckpoint,
)

__all__ = [
    "CheckpointConfig",
    "CheckpointHooks",
    "CheckpointManager",
    "CheckpointWriteError",
    "RestoreResult",
    "SaveResult",
    "SkippedCheckpoint",
]
