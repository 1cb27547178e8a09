"""The node checks, one function (or, for storage, one object) each. Every check returns a `CheckResult`
that passes, fails, or is skipped with the reason it could not run here (its tool or device is absent:
a CPU node, a container without the device). A check never raises: an error is its failure.

Each one is bounded in time: the device tools by a subprocess timeout, the shared file system by a
deadline on a thread, since a hung Lustre or NFS mount blocks a process in the kernel where no timeout
of its own reaches it (NVRx's own storage probe runs in a subprocess for the same reason).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

Status = Literal["pass", "fail", "skip"]
GIB = 1 << 30


@dataclass(frozen=True)
class CheckResult:
    name: str
    status: Status
    detail: str

    def as_dict(self) -> dict[str, str]:
        return {"name": self.name, "status": self.status, "detail": self.detail}


class StorageProbe:
    """The shared file system written, read back and removed within a deadline.

    The probe file is created exclusively under a name no other node or request uses, filled with random
    bytes, fsynced, read back, compared and removed. The file system's own calls run on a daemon thread;
    one still blocked past the deadline is left there (nothing can interrupt it) and remembered, and
    every later call fails at once while it stays blocked, so a hung mount costs one thread, not one per
    request."""

    name = "storage"

    def __init__(self, path: Path | None, deadline_s: float) -> None:
        self.path = path
        self.deadline_s = deadline_s
        self._blocked: threading.Thread | None = None
        self._blocked_since = 0.0

    def __call__(self) -> CheckResult:
        if self.path is None:
            return CheckResult(self.name, "skip", "no storage path given")
        if self._blocked is not None and self._blocked.is_alive():
            stuck = time.monotonic() - self._blocked_since
            return CheckResult(
                self.name, "fail", f"{self.path}: an earlier probe is still blocked ({stuck:.0f} s)"
            )
        outcome: list[str] = []
        probe = threading.Thread(
            target=_probe_file, args=(self.path, outcome), daemon=True, name="storage-probe"
        )
        started = time.monotonic()
        probe.start()
        probe.join(self.deadline_s)
        if probe.is_alive():
            self._blocked, self._blocked_since = probe, started
            return CheckResult(self.name, "fail", f"{self.path}: no answer within {self.deadline_s:g} s")
        self._blocked = None
        took = time.monotonic() - started
        if outcome:
            return CheckResult(self.name, "fail", f"{self.path}: {outcome[0]}")
        return CheckResult(self.name, "pass", f"{self.path}: written, read back and removed in {took:.3f} s")


def _probe_file(directory: Path, outcome: list[str]) -> None:
    """Append the failure to `outcome`, nothing when the round trip worked."""
    payload = os.urandom(4096)
    probe = directory / f".node-health.{socket.gethostname()}.{os.getpid()}.{payload[:6].hex()}"
    try:
        # The job's output directory may not exist yet when the first rendezvous asks (no prepare-dirs
        # init container when the pod runs as root): made here, on the file system under test.
        directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, payload)
            os.fsync(fd)
        finally:
            os.close(fd)
        if probe.read_bytes() != payload:
            outcome.append("the probe file read back differs from what was written")
        probe.unlink()
    except OSError as exc:
        outcome.append(f"{type(exc).__name__}: {exc.strerror or exc}")
        with contextlib.suppress(OSError):
            probe.unlink(missing_ok=True)


def nvme_free(path: Path | None, min_free_gib: float) -> CheckResult:
    """Free space (what an unprivileged writer may use) on the node-local NVMe over the floor."""
    name = "nvme"
    if path is None:
        return CheckResult(name, "skip", "no NVMe path given")
    try:
        stat = os.statvfs(path)
    except OSError as exc:
        return CheckResult(name, "fail", f"{path}: {exc.strerror or exc}")
    free_gib = stat.f_bavail * stat.f_frsize / GIB
    verdict: Status = "pass" if free_gib >= min_free_gib else "fail"
    return CheckResult(name, verdict, f"{path}: {free_gib:.1f} GiB free, floor {min_free_gib:g} GiB")


def _run(argv: list[str], timeout_s: float) -> tuple[int, str]:
    """(exit status, output); -1 with a reason when it did not finish in time or could not start. The
    tool runs in a session of its own, killed whole at the deadline: a child it left holding the output
    pipe would otherwise keep the check waiting past it."""
    try:
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
        )
    except OSError as exc:
        return -1, f"{argv[0]}: {exc.strerror or exc}"
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        return -1, f"{argv[0]} did not finish within {timeout_s:g} s"
    return proc.returncode, out if proc.returncode == 0 else (err or out)


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else "no output"


def gpus(expected: int, timeout_s: float, search_path: str | None = None) -> CheckResult:
    """nvidia-smi lists at least `expected` GPUs (any number when 0) and none reports an uncorrected
    volatile ECC error."""
    name = "gpu"
    tool = shutil.which("nvidia-smi", path=search_path)
    if tool is None:
        return CheckResult(name, "skip", "nvidia-smi is not in this container (no GPU tools on this node)")
    query = "--query-gpu=index,pci.bus_id,ecc.errors.uncorrected.volatile.total"
    status, out = _run([tool, query, "--format=csv,noheader,nounits"], timeout_s)
    if status != 0:
        return CheckResult(name, "fail", f"nvidia-smi exited {status}: {_last_line(out)}")
    rows = [[cell.strip() for cell in line.split(",")] for line in out.splitlines() if line.strip()]
    bad = [row[1] for row in rows if len(row) > 2 and row[2].isdigit() and int(row[2]) > 0]
    if bad:
        return CheckResult(name, "fail", f"uncorrected ECC errors on {', '.join(bad)}")
    if len(rows) < expected:
        return CheckResult(name, "fail", f"nvidia-smi lists {len(rows)} GPU(s), the pod has {expected}")
    return CheckResult(name, "pass", f"{len(rows)} GPU(s) listed, no uncorrected ECC error")


def efa(
    expected: int, timeout_s: float, search_path: str | None = None, dev: Path = Path("/dev/infiniband")
) -> CheckResult:
    """libfabric's EFA provider lists at least `expected` devices (`fi_info -p efa`)."""
    name = "efa"
    if expected == 0:
        return CheckResult(name, "skip", "no EFA device expected on this node")
    tool = shutil.which("fi_info", path=search_path)
    if tool is None:
        return CheckResult(name, "skip", "fi_info is not in this container (no libfabric)")
    if not any(dev.glob("uverbs*")):
        return CheckResult(name, "skip", f"no EFA device visible in this container ({dev})")
    status, out = _run([tool, "-p", "efa", "-t", "FI_EP_RDM"], timeout_s)
    if status != 0:
        return CheckResult(name, "fail", f"fi_info -p efa exited {status}: {_last_line(out)}")
    domains = {
        line.split(":", 1)[1].strip() for line in out.splitlines() if line.strip().startswith("domain:")
    }
    if len(domains) < expected:
        return CheckResult(
            name, "fail", f"fi_info lists {len(domains)} EFA device(s), the pod has {expected}"
        )
    return CheckResult(name, "pass", f"{len(domains)} EFA device(s) listed")
