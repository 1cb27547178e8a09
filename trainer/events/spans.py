"""Where one attempt's time goes from its `run_start` to its `restore` event: named, consecutive spans.

The start-up of an attempt (process group, mesh, checkpoint manager, the training function building its
model and optimizer, the restore agreement, the load) is one stretch of a recovery's MTTR (the
`restore` phase of tools/recovery_phases.py). `begin()` is called where `run_start` is written, each
piece calls `mark(name)` when it is done, and the `restore` event carries the result as `spans`
(seconds per piece, in the order they ran; Contract 3). One clock per process, reset by every attempt;
marks after the restore event (or with no attempt begun) are ignored, so the cost on the training path
is nothing.
"""

from __future__ import annotations

import threading
import time

_lock = threading.Lock()
_marks: list[tuple[str, float]] | None = None
_last = 0.0


def begin() -> None:
    """Start the clock of a new attempt (at its run_start)."""
    global _marks, _last
    with _lock:
        _marks, _last = [], time.perf_counter()


def mark(name: str) -> None:
    """The piece `name` ended now: it took the time since the previous mark (or begin)."""
    global _last
    with _lock:
        if _marks is None:
            return
        now = time.perf_counter()
        _marks.append((name, now - _last))
        _last = now


def take() -> dict[str, float] | None:
    """The spans so far (a repeated name adds up), and the clock stops; None when none was running."""
    global _marks
    with _lock:
        marks, _marks = _marks, None
    if marks is None:
        return None
    out: dict[str, float] = {}
    for name, seconds in marks:
        out[name] = round(out.get(name, 0.0) + seconds, 4)
    return out
