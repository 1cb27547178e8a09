"""A suspect node: the one record every detector of a sick node hands to whatever acts on it.

The numerical guard (trainer/resilience/guard.py) marks a node suspect when the same rank corrupts steps
repeatedly; a straggler detector marks one that stays slow. Both call `report` with a `SuspectNode`, on
every rank alike (each learned it from the same collective): rank 0 writes the `node_suspect` event
(Contract 3; the live metric `trainer_suspect_nodes_total` counts them) and every rank runs the handlers
registered with `on_suspect`, which is where an eviction into a hot spare plugs in (the suspect node's
own ranks see `node == job.node` and can leave cleanly). With no handler a suspect node is reported only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

log = logging.getLogger(__name__)

Source = Literal["guard", "straggler"]


@dataclass(frozen=True)
class SuspectNode:
    """A node some detector no longer trusts."""

    node: int
    """Its group rank (the launcher's node index, `job.node` on its ranks)."""
    ranks: tuple[int, ...]
    """The ranks that showed it."""
    source: Source
    """Which detector: the numerical guard or the straggler detector."""
    reason: str
    """One line: what it saw."""
    step: int
    """The step at which it became suspect."""


Handler = Callable[[SuspectNode], None]
_handlers: list[Handler] = []


def on_suspect(handler: Handler) -> Callable[[], None]:
    """Run `handler` on every rank for each suspect node reported in this process; returns its removal."""
    _handlers.append(handler)
    return lambda: _handlers.remove(handler) if handler in _handlers else None


def report(suspect: SuspectNode, events: Any, *, rank: int) -> None:
    """Report `suspect`: the `node_suspect` event (rank 0), a warning, then every handler (every rank).
    A failing handler is logged, not raised: a report never stops training by itself."""
    log.warning(
        "node %d suspect (%s, ranks %s, step %d): %s",
        suspect.node, suspect.source, list(suspect.ranks), suspect.step, suspect.reason,
    )  # fmt: skip
    if rank == 0:
        events.emit(
            "node_suspect",
            node=suspect.node,
            ranks=list(suspect.ranks),
            source=suspect.source,
            reason=suspect.reason,
            step=suspect.step,
        )
    for handler in list(_handlers):
        try:
            handler(suspect)
        except Exception:
            log.exception("suspect-node handler %r failed", handler)


def node_of(rank: int, local_world_size: int) -> int:
    """The node of `rank` when every node runs `local_world_size` ranks (ranks are laid out node by node)."""
    return rank // max(1, local_world_size)
