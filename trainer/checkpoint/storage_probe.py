"""`python -m trainer.checkpoint.storage_probe`: this node's shared-storage throughput, with
checkpoint-sized files.

The cluster smoke run starts it in every pod at once (tools/smoke_plan.py builds the Job), so the file
system sees the load a durable checkpoint puts on it: each pod writes `--files` files of `--bytes` (one
rank's checkpoint shard each, as the sizing model computes it) in parallel, fsyncs them, reads them back
with the page cache out of the way (O_DIRECT where the file system takes it, else the written pages are
dropped with posix_fadvise(DONTNEED) after the fsync), and removes them. It prints one JSON line:

    {"probe": "storage", "node": ..., "write_mbps": ..., "read_mbps": ..., "expect_mbps": ..., ...}

Bounded: at most `--files x --bytes` bytes, and every phase stops at `--time-limit` seconds after the
start (the line then says `"time_limited": true` and the MB/s are of what was moved). `--start-at` (unix
time) lines the pods up so they measure together. Exit 0 with the line, 2 with one line naming the
option on a bad argument or a directory without room. The data is random (the FSx file system compresses
with LZ4: zeros would measure the compressor). Needs only the standard library (no torch import).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import mmap
import os
import shutil
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

MB = 1e6
BLOCK = 4 * 2**20  # 4 MiB: a multiple of every O_DIRECT alignment, large enough to amortize round trips
MAX_FILES = 64


class ProbeError(Exception):
    """A usage or environment problem: one line naming the option."""


@dataclass
class PhaseResult:
    nbytes: int = 0
    seconds: float = 0.0
    time_limited: bool = False

    @property
    def mbps(self) -> float:
        return self.nbytes / MB / self.seconds if self.seconds > 0 else 0.0


def _pattern() -> bytes:
    """A random block, rotated per write so no two consecutive blocks are the same bytes."""
    return os.urandom(BLOCK)


def _write_file(path: Path, nbytes: int, deadline: float, result: PhaseResult, lock: threading.Lock) -> None:
    data = memoryview(_pattern() * 2)
    written = 0
    limited = False
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        while written < nbytes:
            if time.monotonic() >= deadline:
                limited = True
                break
            shift = (written // BLOCK * 4099) % BLOCK
            chunk = data[shift : shift + min(BLOCK, nbytes - written)]
            written += os.write(fd, chunk)
        os.fsync(fd)  # the write is measured until it is durable, as a checkpoint commit is
        if hasattr(os, "posix_fadvise"):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # clean pages can go now
    finally:
        os.close(fd)
    with lock:
        result.nbytes += written
        result.time_limited |= limited


def _open_uncached(path: Path) -> tuple[int, str]:
    """A descriptor that reads past the page cache: O_DIRECT when the file system takes it."""
    flag = getattr(os, "O_DIRECT", 0)
    if flag:
        try:
            return os.open(path, os.O_RDONLY | flag), "o_direct"
        except OSError:
            pass  # tmpfs and some others refuse O_DIRECT
    fd = os.open(path, os.O_RDONLY)
    if hasattr(os, "posix_fadvise"):
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        return fd, "fadvise"
    return fd, "none"


def _read_file(
    path: Path, deadline: float, result: PhaseResult, modes: list[str], lock: threading.Lock
) -> None:
    fd, mode = _open_uncached(path)
    buf = mmap.mmap(-1, BLOCK)  # page-aligned, as O_DIRECT needs
    got = 0
    limited = False
    try:
        while True:
            if time.monotonic() >= deadline:
                limited = True
                break
            try:
                n = os.readv(fd, [buf])
            except OSError:
                if mode != "o_direct":
                    raise
                # O_DIRECT refused at read time (an unaligned tail): finish through the cache.
                os.close(fd)
                fd = os.open(path, os.O_RDONLY)
                os.lseek(fd, got, os.SEEK_SET)
                mode = "fadvise"
                continue
            if n == 0:
                break
            got += n
    finally:
        os.close(fd)
        buf.close()
    with lock:
        result.nbytes += got
        result.time_limited |= limited
        modes.append(mode)


def _run_phase(work: list[tuple[Callable[..., None], tuple[object, ...]]]) -> float:
    """Run each (function, args) on its own thread at once; the seconds until all are done. A failed
    write or read (ENOSPC, EIO) fails the probe instead of lowering its figure."""
    errors: list[OSError] = []

    def guarded(target: Callable[..., None], args: tuple[object, ...]) -> None:
        try:
            target(*args)
        except OSError as err:
            errors.append(err)

    threads = [threading.Thread(target=guarded, args=item) for item in work]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return time.monotonic() - start


def probe(directory: Path, nbytes: int, files: int, time_limit_s: float, node: str) -> dict[str, object]:
    """Write, fsync, read back and remove `files` files of `nbytes` in `directory`; the measured figures."""
    created = not directory.exists()
    directory.mkdir(parents=True, exist_ok=True)
    paths = [directory / f"probe-{node}-{os.getpid()}-{i}.bin" for i in range(files)]
    lock = threading.Lock()
    write, read = PhaseResult(), PhaseResult()
    modes: list[str] = []
    try:
        free = shutil.disk_usage(directory).free
        if files * nbytes > free:
            raise ProbeError(
                f"--bytes: {files} x {nbytes} bytes do not fit in {directory} ({free} bytes free)"
            )
        deadline = time.monotonic() + time_limit_s
        write.seconds = _run_phase([(_write_file, (p, nbytes, deadline, write, lock)) for p in paths])
        read.seconds = _run_phase([(_read_file, (p, deadline, read, modes, lock)) for p in paths])
    finally:
        for p in paths:
            p.unlink(missing_ok=True)
        if created:
            # Another pod's files may still be there: the last one out removes the directory.
            with contextlib.suppress(OSError):
                directory.rmdir()
    return {
        "probe": "storage",
        "node": node,
        "dir": str(directory),
        "files": files,
        "bytes_per_file": nbytes,
        "bytes_written": write.nbytes,
        "write_s": round(write.seconds, 6),
        "write_mbps": round(write.mbps, 3),
        "bytes_read": read.nbytes,
        "read_s": round(read.seconds, 6),
        "read_mbps": round(read.mbps, 3),
        "cache": sorted(set(modes))[0] if len(set(modes)) == 1 else ",".join(sorted(set(modes))),
        "time_limited": write.time_limited or read.time_limited,
    }


def _positive_int(name: str, text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ProbeError(f"{name}: expected an integer, got {text!r}") from None
    if value < 1:
        raise ProbeError(f"{name}: must be >= 1, got {value}")
    return value


def _positive_float(name: str, text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise ProbeError(f"{name}: expected a number, got {text!r}") from None
    if not (value > 0 and value < float("inf")):
        raise ProbeError(f"{name}: must be a finite number > 0, got {text}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m trainer.checkpoint.storage_probe", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--dir", required=True, help="a directory on the file system to measure")
    parser.add_argument("--bytes", required=True, help="bytes per file (one rank's checkpoint shard)")
    parser.add_argument("--files", default="1", help="files written and read in parallel (ranks per node)")
    parser.add_argument("--time-limit", default="120", help="seconds the whole probe may take")
    parser.add_argument("--expect-mbps", default=None, help="this node's expected MB/s (echoed in the line)")
    parser.add_argument("--node", default=None, help="name in the line (default: $NODE_NAME or the host)")
    parser.add_argument(
        "--start-at", default=None, help="unix time to start at, so every pod measures at once"
    )
    args = parser.parse_args(argv)
    try:
        nbytes = _positive_int("--bytes", args.bytes)
        files = _positive_int("--files", args.files)
        if files > MAX_FILES:
            raise ProbeError(f"--files: at most {MAX_FILES}, got {files}")
        limit = _positive_float("--time-limit", args.time_limit)
        expect = _positive_float("--expect-mbps", args.expect_mbps) if args.expect_mbps else None
        start_at = _positive_float("--start-at", args.start_at) if args.start_at else None
        node = args.node or os.environ.get("NODE_NAME") or socket.gethostname()
        if start_at is not None:
            time.sleep(max(0.0, min(start_at - time.time(), limit)))
        line = probe(Path(args.dir), nbytes, files, limit, node)
    except ProbeError as err:
        print(f"storage probe: {err}", file=sys.stderr)
        return 2
    except OSError as err:
        print(f"storage probe: --dir: {args.dir}: {err.strerror or err}", file=sys.stderr)
        return 2
    if expect is not None:
        line["expect_mbps"] = expect
    print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
