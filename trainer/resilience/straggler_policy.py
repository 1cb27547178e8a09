"""The straggler policies (stdlib only: the configuration layer imports them without torch; the scorer and
`decide` are in trainer/resilience/straggler.py)."""

from __future__ import annotations

from typing import Literal

StragglerPolicy = Literal["report", "evict"]
POLICIES: tuple[str, ...] = ("report", "evict")
