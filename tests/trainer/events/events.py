"""Hand-written event records for the summary and fold tests (the fields every event carries)."""

from __future__ import annotations

from typing import Any


def event(
    ev: str, t: float, rank: int = 0, restart: int = 0, iteration: int = 0, **fields: Any
) -> dict[str, Any]:
    """One event as trainer/events/metrics.py writes it; `pid` follows `restart` (a new process)."""
    return {
        "ev": ev,
        "t": t,
        "rank": rank,
        "pid": 1000 + restart,
        "restart": restart,
        "iteration": iteration,
    } | fields
