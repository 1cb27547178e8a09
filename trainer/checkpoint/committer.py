"""The commit of one pending save, run in a thread of its own instead of at the loop's step boundaries.

Polled from the loop, a save's agreement rounds, its local seal and its commit ran between two steps:
three or four steps after every save each stopped for a collective that waits for the slowest rank
(rank skew), and rank 0's commit (the .metadata, the signed manifest, the rename, retention) kept every
other rank waiting in the same broadcast: together many times the save's own stall. Here the manager's
blocking finalize (its rounds, seal, drain and commit, on the manager's own group) runs in this thread
while the loop trains on.

Every rank starts its thread at the same save and the loop touches neither the pending save nor the
manager's group until it joins the thread, so the thread's collectives pair up across ranks exactly as
the loop's did. The loop joins at the points every rank reaches together (the next save, the final
save, a restore): a failed save surfaces there as CheckpointWriteError, on every rank at the same step,
so every rank still takes the same branch (trainer/checkpoint/loop.py).
"""

from __future__ import annotations

import threading
from collections.abc import Callable


class BackgroundCommit:
    """One pending save's finalize (`run`, the manager's blocking wait) in a daemon thread."""

    JOIN_POLL_S = 0.5
    """How often a join that waits pings the loop's progress (the in-process Wrapper's soft timeout)."""

    def __init__(self, run: Callable[[], list[int]], step: int) -> None:
        self.step = step
        self._committed: list[int] = []
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._main, args=(run,), name=f"ckpt-commit-{step}", daemon=True
        )
        self._thread.start()

    def _main(self, run: Callable[[], list[int]]) -> None:
        try:
            self._committed = run()
        except BaseException as exc:  # handed to the loop thread at its join
            self._error = exc

    @property
    def done(self) -> bool:
        return not self._thread.is_alive()

    def join(self, progress: Callable[[], None] | None = None) -> list[int]:
        """Wait for the commit (pinging `progress` meanwhile); the committed steps, or the thread's error
        raised here. A thread that outlived an abort ends on its own: its collectives fail or time out."""
        while self._thread.is_alive():
            self._thread.join(self.JOIN_POLL_S)
            if progress is not None and self._thread.is_alive():
                progress()
        if self._error is not None:
            raise self._error
        return self._committed
