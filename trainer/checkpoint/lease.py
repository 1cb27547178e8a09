"""One owner per checkpoint directory: a lease file that the run holding the directory refreshes.

    <ckpt_dir>/.lease.json   {"job": <job uid>, "host", "pid", "heartbeat": <unix time>, "acquired",
                              "lineage": <random id drawn when the directory was first claimed>}

Global rank 0 claims the directory when the checkpoint manager starts (before any step) and refreshes the
heartbeat from a background thread every TIMEOUT_S / 4. A claim meets one of:
- no lease, or one of this job (a restart of the same job): claimed;
- another job's lease whose heartbeat is fresh (and, on this host, whose pid is alive): the run stops
  before training with one line naming that job (UnrecoverableError on `ckpt_dir`);
- another job's stale lease (heartbeat older than TIMEOUT_S, or its pid gone on this host): taken over,
  logged; this run inherits the lineage, and with it the checkpoints (retention may delete them).
Manifests and NVMe seals record the job (`owner`) and the lineage; retention and the NVMe tier touch
only those of the current lineage. A checkpoint directory deleted and recreated gets a new lineage, so
the NVMe steps of the run that wrote the old one are never restored, and are pruned.
A run that completes releases the lease (CheckpointLoop.close after the final commit).

The job uid is the launcher's rendezvous id (TORCHELASTIC_RUN_ID: the chart's JOB_ID, one per release),
else JOB_ID, else this process (a plain local run without a launcher: `local:<host>:<pid>`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from trainer.config.errors import UnrecoverableError

log = logging.getLogger(__name__)

LEASE = ".lease.json"
TIMEOUT_S = 90.0
"""A lease whose heartbeat is older than this is stale (its holder is gone)."""
MAX_LEASE_BYTES = 64 * 1024


def job_uid(env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    for name in ("TORCHELASTIC_RUN_ID", "JOB_ID"):
        value = env.get(name, "")
        if value and value != "none":  # torchrun's default rendezvous id is "none": not an identity
            return value
    return f"local:{socket.gethostname()}:{os.getpid()}"


def read(directory: Path) -> dict[str, Any] | None:
    """The lease in `directory` (None: none, or unreadable: treated as absent and overwritten)."""
    try:
        fd = os.open(Path(directory) / LEASE, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        raw = os.read(fd, MAX_LEASE_BYTES)
    finally:
        os.close(fd)
    try:
        lease = json.loads(raw)
    except ValueError:
        return None
    return lease if isinstance(lease, dict) and isinstance(lease.get("job"), str) else None


def _stale(lease: dict[str, Any], now: float, timeout_s: float) -> str | None:
    """Why `lease` no longer holds (None: it holds)."""
    beat = lease.get("heartbeat")
    if not isinstance(beat, (int, float)):
        return "no heartbeat"
    if now - beat > timeout_s:
        return f"heartbeat {now - beat:.0f} s ago"
    if lease.get("host") == socket.gethostname() and isinstance(lease.get("pid"), int):
        try:
            os.kill(lease["pid"], 0)
        except ProcessLookupError:
            return f"its process {lease['pid']} on this host is gone"
        except PermissionError:
            pass
    return None


class Lease:
    """Rank 0's claim on a checkpoint directory (claim, heartbeat, release)."""

    def __init__(self, directory: Path, job: str, *, timeout_s: float = TIMEOUT_S) -> None:
        self.dir, self.job, self.timeout_s = Path(directory), job, timeout_s
        self.lineage = ""
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._acquired = time.time()

    def claim(self) -> None:
        """Claim the directory or raise UnrecoverableError naming the job that holds it."""
        self.dir.mkdir(parents=True, exist_ok=True)
        held = read(self.dir)
        now = time.time()
        if held is not None and held["job"] != self.job:
            why = _stale(held, now, self.timeout_s)
            if why is None:
                beat = held.get("heartbeat")
                age = f"{now - beat:.0f} s ago" if isinstance(beat, (int, float)) else "?"
                raise UnrecoverableError(
                    "ckpt_dir",
                    f"{self.dir} is in use by job {held['job']!r} (host {held.get('host')}, pid "
                    f"{held.get('pid')}, heartbeat {age}): give this run its own checkpoint directory "
                    "(chart: runName) or stop the other job",
                )
            log.warning(
                "checkpoint directory %s: taking over the lease of job %r (%s)", self.dir, held["job"], why
            )
        if held is not None and isinstance(held.get("lineage"), str) and held["lineage"]:
            self.lineage = held["lineage"]
            if held["job"] == self.job:
                self._acquired = held.get("acquired", self._acquired)
        else:
            self.lineage = secrets.token_hex(16)
        self._write()
        again = read(self.dir)
        if again is None or again["job"] != self.job or again.get("pid") != os.getpid():
            other = again["job"] if again is not None else "?"
            raise UnrecoverableError("ckpt_dir", f"{self.dir} was claimed by job {other!r} at the same time")

    def _write(self) -> None:
        lease = {
            "job": self.job,
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "heartbeat": time.time(),
            "acquired": self._acquired,
            "lineage": self.lineage,
        }
        part = self.dir / f"{LEASE}.{os.getpid()}.part"
        part.write_text(json.dumps(lease), encoding="utf-8")
        os.replace(part, self.dir / LEASE)

    def start_heartbeat(self) -> None:
        self._thread = threading.Thread(target=self._beat, name="ckpt-lease", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(self.timeout_s / 4):
            held = read(self.dir)
            if held is not None and held["job"] != self.job:
                log.error("checkpoint directory %s: the lease was taken over by job %r; this run no longer "
                          "owns it", self.dir, held["job"])  # fmt: skip
                return
            try:
                self._write()
            except OSError as exc:
                log.warning("checkpoint directory lease not refreshed: %s", exc)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def release(self) -> None:
        """The run completed: the directory is free for the next job at once."""
        self.stop()
        held = read(self.dir)
        if held is not None and held["job"] == self.job:
            with contextlib.suppress(OSError):
                (self.dir / LEASE).unlink()
