"""The one summary of repeated measurements every benchmark reports: median, min, max and count."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any


def spread(values: Sequence[float], *, with_values: bool = False) -> dict[str, Any] | None:
    """Median, min, max and count of `values` (None when there are none); `with_values` adds them sorted,
    for tables that show every repetition."""
    if not values:
        return None
    vals = sorted(float(v) for v in values)
    out: dict[str, Any] = {"median": statistics.median(vals), "min": vals[0], "max": vals[-1], "n": len(vals)}
    if with_values:
        out["values"] = vals
    return out
