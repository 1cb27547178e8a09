"""Key files: read once, checked, never logged (only a short fingerprint of a key may be).

A key file is a regular file of MIN_KEY_BYTES..MAX_KEY_BYTES bytes once surrounding whitespace is
stripped (a Kubernetes Secret written with a trailing newline is the same key). It is opened without
following a final symlink loop forever, never blocks (O_NONBLOCK: a FIFO is refused by fstat before any
read) and is read from the descriptor that was checked.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import stat
from collections.abc import Mapping
from pathlib import Path

from trainer.config.errors import UnrecoverableError

REPLICA_KEY_ENV = "TRAINER_REPLICA_KEY_FILE"
"""The job's replica-channel key file (chart: the release's `<release>-replica-key` Secret)."""
CKPT_KEY_ENV = "TRAINER_CKPT_KEY_FILE"
"""The team's checkpoint key file (infra: the team's `checkpoint-key` Secret)."""
LOCAL_CKPT_KEY = ".ckpt-key"
"""A local run's checkpoint key, next to its checkpoint directory (created 0600 when absent)."""
MIN_KEY_BYTES, MAX_KEY_BYTES = 32, 4096


def read_key_file(path: Path, field: str) -> bytes:
    """The key in `path`; UnrecoverableError naming `field` if it is not a usable key file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise UnrecoverableError(field, f"cannot open key file {path}: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnrecoverableError(field, f"key file {path} is not a regular file")
        if st.st_size > MAX_KEY_BYTES + 64:
            raise UnrecoverableError(
                field, f"key file {path} has {st.st_size} bytes, at most {MAX_KEY_BYTES}"
            )
        raw = os.read(fd, MAX_KEY_BYTES + 65)
    finally:
        os.close(fd)
    key = raw.strip()
    if not MIN_KEY_BYTES <= len(key) <= MAX_KEY_BYTES:
        raise UnrecoverableError(
            field, f"key file {path} holds {len(key)} bytes, a key needs {MIN_KEY_BYTES} to {MAX_KEY_BYTES}"
        )
    return key


def key_id(key: bytes) -> str:
    """What a log line may say about a key: 8 hex digits of its SHA-256 (tells two keys apart)."""
    return hashlib.sha256(b"trainer key id\0" + key).hexdigest()[:8]


def replica_file_key(env: Mapping[str, str] | None = None) -> bytes | None:
    """The job's replica key from its file, or None when the env var is not set (a plain local run)."""
    env = os.environ if env is None else env
    path = env.get(REPLICA_KEY_ENV)
    return read_key_file(Path(path), REPLICA_KEY_ENV) if path else None


def checkpoint_key(ckpt_dir: Path, env: Mapping[str, str] | None = None, *, create: bool = True) -> bytes:
    """The key that signs and verifies checkpoints of `ckpt_dir`: the team's key file when the env var
    names one, else the local run's `<parent of ckpt_dir>/.ckpt-key` (created 0600 if absent and
    `create`; docs/security.md says what that protects and what not)."""
    env = os.environ if env is None else env
    path = env.get(CKPT_KEY_ENV)
    if path:
        return read_key_file(Path(path), CKPT_KEY_ENV)
    local = Path(ckpt_dir).absolute().parent / LOCAL_CKPT_KEY
    if create and not local.exists():
        local.parent.mkdir(parents=True, exist_ok=True)
        try:  # O_EXCL: of two ranks (or runs) creating it at once, one writes, the other reads
            fd = os.open(local, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except FileExistsError:
            pass
        else:
            part = secrets.token_hex(32).encode()
            with os.fdopen(fd, "wb") as fh:
                fh.write(part)
                fh.flush()
                os.fsync(fh.fileno())
    return _read_settled(local)


def _read_settled(path: Path) -> bytes:
    """Read a key another process may be writing right now (O_EXCL then write): retry briefly."""
    import time

    for _ in range(50):
        try:
            return read_key_file(path, CKPT_KEY_ENV)
        except UnrecoverableError as exc:
            if "holds 0 bytes" not in exc.why:
                raise
        time.sleep(0.1)
    return read_key_file(path, CKPT_KEY_ENV)
