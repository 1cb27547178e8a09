"""Does a token file fit the run? Checked before any process group, in bounded time for any file size.

`check_token_file` is what `--check-config` (the pod's init container) and every worker's start-up run:
the file is a .npy token array (not a pickle, text or truncated file named .npy), 1-D uint16/uint32, long
enough for one sequence per rank, and its token ids are below the preset's vocabulary. The vocabulary
check never scans the whole file: it reads the maximum that `python -m trainer.reference.data` records next to
the file (`<file>.meta.json`, trusted only while its length and dtype match the file) plus a fixed-size
sample (the first and last tokens and evenly spaced chunks, 1 Mi tokens at most). An id the sample misses
is caught in the batch path (`check_batch_tokens`) at the step that meets it, as an UnrecoverableError.

Every failure is a ConfigError on `data_path` whose message says what was found and how to fix it.
"""

from __future__ import annotations

import io
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from trainer.config.errors import UnrecoverableError
from trainer.config.inputs import (
    SIDECAR_MAX_BYTES,
    TOKEN_FILE_MAX_BYTES,
    StableFile,
    open_regular,
    read_small,
)

TOKEN_DTYPES = (np.dtype(np.uint16), np.dtype(np.uint32))
SAMPLE_CHUNKS = 16
SAMPLE_CHUNK_TOKENS = 1 << 16  # 16 chunks of 64 Ki tokens: 1 Mi tokens, 2-4 MiB read at most
FIX = (
    "write one with python -m trainer.reference.data, "
    "or convert yours with np.save(path, tokens.astype(np.uint32))"
)


def meta_path(path: str | Path) -> Path:
    """Where `python -m trainer.reference.data` records a token file's length, dtype and maximum id."""
    path = Path(path)
    return path.with_name(path.name + ".meta.json")


def write_meta(
    path: str | Path, *, num_tokens: int, dtype: np.dtype[Any], max_token: int, vocab: int
) -> Path:
    """Record the file's facts beside it (written before the token file is renamed into place)."""
    out = meta_path(path)
    record = {"num_tokens": num_tokens, "dtype": np.dtype(dtype).name, "max_token": max_token, "vocab": vocab}
    out.write_text(json.dumps(record) + "\n", encoding="utf-8")
    return out


@dataclass(frozen=True)
class TokenFileInfo:
    """What the check learned about a token file."""

    num_tokens: int
    dtype: str
    max_seen: int
    """Largest id in the sample (and the recorded maximum, when there is one)."""
    recorded_max: int | None


def _error(why: str) -> UnrecoverableError:
    from trainer.config.train_config import (
        ConfigError,  # config imports the model, which this module does not need
    )

    return ConfigError("data_path", why)


HEADER_READ_BYTES = 64 * 1024 + 16  # a version 1.0 header's largest size; numpy caps 2.0 headers lower


def read_header(f: StableFile) -> tuple[np.dtype[Any], tuple[int, ...], int]:
    """(dtype, shape, data offset) of the opened .npy file, or a ConfigError saying what it is instead."""
    path = f.path
    head = f.pread(0, min(f.size, HEADER_READ_BYTES))
    if not head.startswith(b"\x93NUMPY"):
        raise _error(f"{path} is not a .npy array: {_what_is(head[:8])}; {FIX}")
    fh = io.BytesIO(head)
    try:
        version = np.lib.format.read_magic(fh)
        reader = {
            (1, 0): np.lib.format.read_array_header_1_0,
            (2, 0): np.lib.format.read_array_header_2_0,
        }.get(version)
        if reader is None:
            raise _error(f"{path}: unsupported .npy format version {version}; {FIX}")
        shape, _fortran, dtype = reader(fh)
        return dtype, shape, fh.tell()
    except (ValueError, SyntaxError) as exc:  # numpy's header parser: a damaged or cut-off header
        raise _error(f"{path} has a damaged .npy header ({exc}); {FIX}") from None


def _what_is(head: bytes) -> str:
    if head[:1] == b"\x80":
        return "it is a Python pickle"
    if head[:2] == b"PK":
        return "it is a zip archive (an .npz? save one array with np.save)"
    if not head:
        return "it is empty"
    try:
        head.decode("utf-8")
    except UnicodeDecodeError:
        return f"it starts with bytes {head[:8]!r}"
    return f"it looks like text (starts with {head.decode('utf-8')!r})"


def _recorded_max(path: Path, num_tokens: int, dtype: np.dtype[Any]) -> int | None:
    """The recorded maximum id, if the sidecar exists and still describes this file. A sidecar that is
    not a small regular file (a FIFO, /dev/zero, a symlink loop) is refused: reading it would hang."""
    sidecar = meta_path(path)
    try:
        os.stat(sidecar)
    except FileNotFoundError:  # none (or a dangling link): the sample still runs
        return None
    except (OSError, ValueError):
        pass  # open_regular says what is wrong with it
    raw = read_small(sidecar, "data_path", max_bytes=SIDECAR_MAX_BYTES)
    try:
        record = json.loads(raw.decode("utf-8"))
        if record["num_tokens"] == num_tokens and record["dtype"] == dtype.name:
            value = record["max_token"]
            return value if isinstance(value, int) and not isinstance(value, bool) else None
    except (ValueError, KeyError, TypeError):
        pass  # not one of ours: the sample still runs
    return None


def sample_starts(n: int) -> tuple[int, list[int]]:
    """(chunk length, chunk starts) of the fixed-size sample of an n-token file."""
    chunk = min(SAMPLE_CHUNK_TOKENS, n)
    return chunk, sorted({int(s) for s in np.linspace(0, n - chunk, SAMPLE_CHUNKS)})


def _sample_max_fd(f: StableFile, offset: int, n: int, dtype: np.dtype[Any]) -> tuple[int, int]:
    """sample_max over the opened file, read with pread (a file truncated meanwhile is a short read,
    reported as a ConfigError, not the SIGBUS a memory map of its vanished pages raises)."""
    chunk, starts = sample_starts(n)
    best, where = -1, 0
    for start in starts:
        part = np.frombuffer(f.pread(offset + start * dtype.itemsize, chunk * dtype.itemsize), dtype=dtype)
        i = int(part.argmax())
        if int(part[i]) > best:
            best, where = int(part[i]), start + i
    return best, where


def sample_max(tokens: np.ndarray) -> tuple[int, int]:
    """(largest id, its index) over a fixed-size sample: first and last chunk and evenly spaced ones."""
    chunk, starts = sample_starts(int(tokens.shape[0]))
    best, where = -1, 0
    for start in starts:
        part = np.asarray(tokens[start : start + chunk])
        i = int(part.argmax())
        if int(part[i]) > best:
            best, where = int(part[i]), start + i
    return best, where


def check_token_file(
    path: str | Path, *, vocab_size: int, seq_len: int, world_size: int = 1
) -> TokenFileInfo:
    """Raise ConfigError(data_path) unless `path` holds tokens this run can train on; bounded time."""
    path = Path(path)
    with open_regular(path, "data_path", max_bytes=TOKEN_FILE_MAX_BYTES) as f:
        return _check_open_file(f, vocab_size=vocab_size, seq_len=seq_len, world_size=world_size)


def _check_open_file(f: StableFile, *, vocab_size: int, seq_len: int, world_size: int) -> TokenFileInfo:
    path = f.path
    dtype, shape, offset = read_header(f)
    if dtype.hasobject:
        raise _error(f"{path} holds pickled Python objects (dtype object), not token ids; {FIX}")
    if len(shape) != 1 or dtype not in TOKEN_DTYPES:
        raise _error(
            f"{path} holds a {dtype.name} array of shape {shape}; the trainer reads a 1-D uint16 or "
            f"uint32 array; {FIX}"
        )
    num_tokens = int(shape[0])
    size = f.size  # fstat of the descriptor every read below goes to
    if offset + num_tokens * dtype.itemsize > size:
        raise _error(
            f"{path} is truncated: its header promises {num_tokens} tokens "
            f"({offset + num_tokens * dtype.itemsize} bytes), the file has {size} bytes"
        )
    need = world_size * seq_len + 1  # one window per rank, +1 for the shifted target
    if num_tokens < need:
        raise _error(
            f"{path} has {num_tokens} tokens; seq_len {seq_len} on {world_size} rank(s) needs at least "
            f"{need} (write a longer file or lower --seq-len)"
        )
    recorded = _recorded_max(path, num_tokens, dtype)
    if recorded is not None and recorded >= vocab_size:
        raise _error(_beyond_vocab(path, recorded, vocab_size, f"recorded in {meta_path(path).name}"))
    max_seen = recorded if recorded is not None else -1
    if dtype.itemsize * 8 > 16 or vocab_size < 2**16:  # a uint16 file cannot exceed a vocab >= 65536
        sampled, where = _sample_max_fd(f, offset, num_tokens, dtype)
        if sampled >= vocab_size:
            raise _error(_beyond_vocab(path, sampled, vocab_size, f"at token index {where}"))
        max_seen = max(max_seen, sampled)
    return TokenFileInfo(num_tokens, dtype.name, max_seen, recorded)


def _beyond_vocab(path: Path, token: int, vocab_size: int, where: str) -> str:
    return (
        f"{path} holds token id {token} ({where}), but the preset's vocabulary has {vocab_size} ids "
        f"(0..{vocab_size - 1}): the file was tokenized for another vocabulary; retokenize it or pick "
        "a preset with a larger vocabulary"
    )


def check_batch_tokens(inputs: Any, targets: Any, vocab_size: int, *, step: int, path: Path) -> None:
    """Raise UnrecoverableError if a batch holds an id >= vocab_size (before the embedding sees it).

    Cheap (one max over a CPU batch of micro_batch x seq_len ids) and deterministic: the same step meets
    the same id after any restart, so retrying it only repeats the failure (on a GPU as a device assert).
    """
    top = max(int(inputs.max()), int(targets.max()))
    if top >= vocab_size:
        raise _error(_beyond_vocab(path, top, vocab_size, f"met in the batch of step {step}"))
