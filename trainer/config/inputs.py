"""The trainer's input primitives: files, directories, seconds and environment settings.

Every user-supplied input the trainer reads goes through one of these, so one rule holds everywhere: the
value is refused with one `config error: <field>: why` line (exit 2 in the init container) or it is used
exactly as written.

- Files are opened once, without blocking (a FIFO would hang a plain open), only when they are regular
  files within a size cap, and every later read goes to that descriptor (`os.pread`), never to the path
  again: a file replaced meanwhile cannot raise FileNotFoundError halfway, and a file truncated meanwhile
  gives a short read (reported), not the SIGBUS a memory map of the vanished pages would.
- Directories are looked up without tracebacks: a symlink loop (ELOOP) is one line naming the field.
- Seconds are finite and at most a week (`timedelta(seconds=1e14)` overflows; no timeout needs more).
- Environment settings are parsed by the same strict parsers as the flags (trainer/config/flags.py).
"""

from __future__ import annotations

import argparse
import errno
import logging
import math
import os
import re
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from trainer.config.errors import UnrecoverableError

MAX_SECONDS = 7 * 24 * 3600.0
"""The longest any seconds-valued setting may be: a week (longer is a typo, and 1e14 overflows timedelta)."""
SIDECAR_MAX_BYTES = 64 * 1024
TOKEN_FILE_MAX_BYTES = 1 << 44  # 16 TiB: far above any token file, far below what an offset can address


def _error(field: str, why: str) -> UnrecoverableError:
    from trainer.config.settings import ConfigError  # light: no model, no torch

    return ConfigError(field, why)


# ---------------------------------------------------------------------------------------------- files


def _describe_mode(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a FIFO (named pipe)"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a regular file"


def os_problem(exc: OSError) -> str:
    """What an OSError means for a path the user gave, in words."""
    if exc.errno == errno.ELOOP:
        return "is a symlink loop (too many levels of symbolic links)"
    if exc.errno == errno.ENOENT:
        return "does not exist"
    if exc.errno == errno.ENOTDIR:
        return "has a component that is not a directory"
    if exc.errno == errno.ENAMETOOLONG:
        return "is a name too long for the file system"
    return f"cannot be opened ({exc.strerror or exc})"


@dataclass
class StableFile:
    """A regular file opened once; `size` is from fstat of that descriptor. Use as a context manager."""

    path: Path
    field: str
    fd: int
    size: int

    def pread(self, offset: int, length: int) -> bytes:
        """Exactly `length` bytes at `offset` of the opened file, or a ConfigError if it shrank."""
        chunks: list[bytes] = []
        got = 0
        while got < length:
            try:
                chunk = os.pread(self.fd, length - got, offset + got)
            except OSError as exc:
                raise _error(self.field, f"{self.path} cannot be read ({exc.strerror or exc})") from None
            if not chunk:
                raise _error(
                    self.field,
                    f"{self.path} changed while it was checked: it ended at byte {offset + got}, "
                    f"{self.size} were there when it was opened (do not rewrite a token file in place)",
                )
            chunks.append(chunk)
            got += len(chunk)
        return b"".join(chunks)

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> StableFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_regular(path: str | Path, field: str, *, max_bytes: int) -> StableFile:
    """Open `path` for reading without blocking; refuse anything but a regular file of at most max_bytes."""
    path = Path(path)
    try:
        # O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer forever.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise _error(field, f"{path} {os_problem(exc)}") from None
    except ValueError:  # an embedded NUL
        raise _error(field, f"{path!r} is not a valid path") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _error(field, f"{path} is {_describe_mode(st.st_mode)}, not a regular file")
        if st.st_size > max_bytes:
            raise _error(field, f"{path} has {st.st_size} bytes, more than the {max_bytes} allowed")
    except BaseException:
        os.close(fd)
        raise
    return StableFile(path, field, fd, st.st_size)


def read_small(path: str | Path, field: str, *, max_bytes: int = SIDECAR_MAX_BYTES) -> bytes:
    """The whole content of a small regular file, read through one descriptor."""
    with open_regular(path, field, max_bytes=max_bytes) as f:
        return f.pread(0, f.size)


# ------------------------------------------------------------------------------------------ directories


def check_dir_lookup(field: str, path: str | Path) -> None:
    """Refuse a directory path on which a symlink loop lies (os.stat fails with ELOOP): Path.exists()
    reads such a path as "not there yet", so a writability check would pass and mkdir fail later."""
    path = Path(path)
    probe = path
    while True:
        try:
            os.stat(probe)
            return
        except FileNotFoundError:
            if probe == probe.parent:
                return
            probe = probe.parent  # not there yet: its nearest existing ancestor decides
        except ValueError:
            raise _error(field, f"{path!r} is not a valid path") from None
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                return  # a file as a parent, no permission: the caller's own checks word these
            where = str(path) if probe == path else f"{path}: {probe}"
            raise _error(field, f"{where} {os_problem(exc)}") from None


def resolved(field: str, path: Path) -> Path:
    """`path.resolve()` whose symlink loop is a ConfigError naming `field`, not a RuntimeError."""
    try:
        return path.resolve()
    except (RuntimeError, OSError) as exc:
        problem = os_problem(exc) if isinstance(exc, OSError) else "is a symlink loop"
        raise _error(field, f"{path} {problem}") from None


# ---------------------------------------------------------------------------------------------- values


def bounded_seconds(field: str, value: float | None) -> None:
    """A seconds-valued setting is finite and at most MAX_SECONDS (None: a derived default)."""
    if value is None:
        return
    if not math.isfinite(value) or value > MAX_SECONDS:
        raise _error(
            field, f"must be at most {MAX_SECONDS:g} seconds (a week), got {value:g}; is the unit right?"
        )


def _seconds_text(text: str) -> float:
    from trainer.config.flags import finite_float

    value = finite_float(text)
    if not 0 < value <= MAX_SECONDS:
        raise ValueError(f"must be in (0, {MAX_SECONDS:g}] seconds, got {text!r}")
    return value


def _port_text(text: str) -> int:
    from trainer.config.flags import int64

    value = int64(text)
    if not 1 <= value <= 65535:
        raise ValueError(f"must be a port in [1, 65535], got {text!r}")
    return value


def _count_text(low: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        from trainer.config.flags import int64

        value = int64(text)
        if value < low:
            raise ValueError(f"must be an integer >= {low}, got {text!r}")
        return value

    return parse


_HOST = re.compile(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,251}[A-Za-z0-9])?|\[?[0-9A-Fa-f:.]+\]?")


def _host_text(text: str) -> str:
    if not _HOST.fullmatch(text):
        raise ValueError(f"must be a host name or IP address, got {text!r}")
    return text


def _log_level_text(text: str) -> str:
    if text not in logging.getLevelNamesMapping():
        names = ", ".join(n for n in logging.getLevelNamesMapping() if n != "NOTSET")
        raise ValueError(f"must be one of {names}, got {text!r}")
    return text


def _endpoint_text(text: str) -> str:
    host, sep, port = text.rpartition(":")
    if not sep:
        raise ValueError(f"must be HOST:PORT, got {text!r}")
    _host_text(host)
    _port_text(port)
    return text


def _faults_text(text: str) -> str:
    from trainer.runtime.faults import parse_fault

    for spec in (t.strip() for t in text.split(";")):
        if spec:
            parse_fault(spec)
    return text


ENV_SETTINGS: dict[str, Callable[[str], object]] = {
    "TRAINER_FAULTS": _faults_text,
    "TRAINER_INPROCESS_MONITOR_INTERVAL": _seconds_text,
    "TRAINER_INPROCESS_LAST_CALL_WAIT": _seconds_text,
    "TRAINER_LOG_LEVEL": _log_level_text,
    "TRAINER_STORE_HOST": _host_text,
    "TRAINER_PG_PORT": _port_text,
    "TRAINER_INPROCESS_PORT": _port_text,
    "MASTER_ADDR": _host_text,
    "MASTER_PORT": _port_text,
    "RDZV_ENDPOINT": _endpoint_text,
    "NPROC_PER_NODE": _count_text(1),
    "RANK": _count_text(0),
    "LOCAL_RANK": _count_text(0),
    "GROUP_RANK": _count_text(0),
    "WORLD_SIZE": _count_text(1),
    "LOCAL_WORLD_SIZE": _count_text(1),
    "GROUP_WORLD_SIZE": _count_text(1),
    "TORCHELASTIC_RESTART_COUNT": _count_text(0),
}
"""Every setting the trainer reads from its environment, with the parser of its value. NNODES is not
here: the chart sets MIN:MAX for hot spares and the trainer reads it only as a hint (preflight.World)."""


def check_env(env: Mapping[str, str]) -> None:
    """Parse every trainer setting present in `env`; raise ConfigError naming the variable."""
    for name, parse in ENV_SETTINGS.items():
        text = env.get(name)
        if text is None:
            continue
        try:
            parse(text)
        except (ValueError, argparse.ArgumentTypeError) as exc:  # the flags' parsers raise the latter
            raise _error(name, str(exc)) from None
