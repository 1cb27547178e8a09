"""A pytest plugin: a test fails when a process it started outlives it, detached from the test runner.

Every process the suite starts inherits `BLUEPRINT_TEST_SESSION` (a fresh id per pytest session). After
each test, a process that carries this session's id but no longer descends from the pytest process (its
parent died and it was reparented to init or a subreaper: NVRx's checkpoint worker, a multiprocessing
Manager or resource tracker whose rank is gone) and is still alive after a grace period is killed, and the
test fails naming it. Processes that are still the suite's children (a module fixture's server, a run
shared by several tests) are not orphans and are left alone. Registered in tests/conftest.py.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

SESSION_ENV = "BLUEPRINT_TEST_SESSION"
GRACE_S = 10.0
"""How long an orphan may take to notice its parent is gone and exit (the NVRx worker's watchdog polls
every 0.5 s; interpreter teardown of a torch process takes a few seconds on a loaded machine)."""

_PROC = Path("/proc")


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):
        # An xdist worker runs its own tests: its own id, so that a sibling worker's live processes
        # (which descend from that worker, not from this one) are never taken for this worker's orphans.
        os.environ[SESSION_ENV] = uuid.uuid4().hex
    else:
        os.environ.setdefault(SESSION_ENV, uuid.uuid4().hex)


def _parent(pid: int) -> int:
    try:
        text = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return 0
    return int(text[text.rindex(")") + 2 :].split()[1])


def _tagged(pid: int, tag: bytes) -> bool:
    try:
        return tag in (_PROC / str(pid) / "environ").read_bytes().split(b"\0")
    except OSError:
        return False


def _alive(pid: int) -> bool:
    try:
        state = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return False
    return state[state.rindex(")") + 2] != "Z"  # a zombie is already dead, only not yet reaped


def orphans(root: int, session: str) -> list[int]:
    """Live processes of this test session that no longer descend from `root` (the pytest process)."""
    tag = f"{SESSION_ENV}={session}".encode()
    found = []
    for entry in _PROC.iterdir():
        if not entry.name.isdigit() or int(entry.name) == root or not _tagged(int(entry.name), tag):
            continue
        p, hops = int(entry.name), 0
        while p > 1 and p != root and hops < 64:
            p, hops = _parent(p), hops + 1
        if p != root and _alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def describe(pid: int) -> str:
    try:
        argv = (_PROC / str(pid) / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return f"pid {pid} (gone)"
    return f"pid {pid}: " + " ".join(a.decode(errors="replace") for a in argv if a)[:200]


@pytest.fixture(autouse=True)
def no_process_outlives_its_test() -> Iterator[None]:
    yield
    session = os.environ.get(SESSION_ENV)
    if not session:
        return
    left = orphans(os.getpid(), session)
    deadline = time.monotonic() + GRACE_S
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = [pid for pid in left if _alive(pid)]
    if not left:
        return
    names = [describe(pid) for pid in left]
    for pid in left:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    pytest.fail(
        f"{len(left)} process(es) outlived the run that started them by {GRACE_S:.0f} s (killed now): "
        + "; ".join(names),
        pytrace=False,
    )
