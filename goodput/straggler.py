"""The straggler term: a node that keeps running, slower, and makes every step of the job wait for it.

Not a fault of the model in goodput/model.py (nothing stops, nothing rolls back): while a straggler is in
the job, the job runs at ``1/F`` of its speed (``F``: the straggler's slowdown), so a fraction ``1 - 1/F``
of that wall time is lost. How long it stays depends on the trainer's straggler policy
(trainer/resilience/straggler.py, chart ``stragglerPolicy``):

* ``evict`` (a hot spare stands by): found after ``detect_steps`` steps (the watch's warm-up and window),
  each ``F`` times the step time, then evicted into the spare at the cost of a node loss's MTTR (its
  state comes from the peer replica, at most one step recomputed)::

      cost = detect_steps * F * step_s * (1 - 1/F) + evict_mttr_s

* ``report``: it stays until someone acts on the report (drains the node, restarts the job), after
  ``mitigation_s``::

      cost = mitigation_s * (1 - 1/F)

Stragglers arrive at ``nodes * rate_per_node_day / 86400`` per second; the fraction of wall time lost is
that rate times ``cost`` (first order: stragglers rarely overlap while ``rate x cost << 1``; capped at 1),
and the efficiency with stragglers is the model's efficiency times ``1 -`` that fraction.

Inputs, all **assumptions** (no published per-node straggler rate or slowdown distribution we could
take over):

* ``RATE_PER_NODE_DAY``: half the rate at which Llama 3 405B's run lost a node to hardware (353 of 419
  interruptions over 54 days on 2,048 nodes, arXiv:2407.21783), i.e. one straggler for every two hardware
  losses. Published accounts put stragglers in the same league as hard failures: Meta reports slowness
  in a majority of its large jobs; ByteDance's study of a five-month trace (Lin et al., OSDI '25,
  arXiv:2505.05713) finds stragglers from many causes beyond hardware; ByteRobust (ByteDance, 9,600 GPUs,
  97 % effective training time) evicts suspect nodes early. None gives a per-node rate to copy.
* ``SLOWDOWN``: 1.5, a throttled or degraded GPU; ``--straggler-slowdown`` for others.
* ``MITIGATION_S``: one hour for a person to act on a report (an on-call page, a drain, a restart).
"""

from __future__ import annotations

from dataclasses import dataclass

RATE_PER_NODE_DAY = 0.5 * 353 / 54 / 2048
"""Stragglers per node per day (assumption: half of Llama 3's hardware-loss rate per node)."""
SLOWDOWN = 1.5
"""How many times slower the job runs while a straggler is in it (assumption)."""
MITIGATION_S = 3600.0
"""Seconds until someone acts on a reported straggler (assumption)."""
DETECT_STEPS = 10
"""Steps before the watch evicts: trainer/resilience/straggler.py WARMUP + WINDOW."""


@dataclass(frozen=True)
class StragglerTerm:
    """The straggler inputs (see the module docstring)."""

    rate_per_node_day: float = RATE_PER_NODE_DAY
    slowdown: float = SLOWDOWN
    policy: str = "evict"
    mitigation_s: float = MITIGATION_S
    detect_steps: int = DETECT_STEPS

    def __post_init__(self) -> None:
        if not self.rate_per_node_day >= 0:
            raise ValueError(f"straggler rate must be >= 0, got {self.rate_per_node_day}")
        if not self.slowdown >= 1:
            raise ValueError(f"straggler slowdown must be >= 1, got {self.slowdown}")
        if self.policy not in ("evict", "report"):
            raise ValueError(f"straggler policy must be evict or report, got {self.policy!r}")
        if not self.mitigation_s >= 0:
            raise ValueError(f"straggler mitigation must be >= 0 s, got {self.mitigation_s}")

    def cost_s(self, step_s: float, evict_mttr_s: float) -> float:
        """Wall seconds one straggler costs the job."""
        slow = 1.0 - 1.0 / self.slowdown
        if self.policy == "evict":
            return self.detect_steps * self.slowdown * step_s * slow + evict_mttr_s
        return self.mitigation_s * slow

    def lost(self, nodes: int, step_s: float, evict_mttr_s: float) -> float:
        """Fraction of wall time the job loses to stragglers."""
        rate_s = nodes * self.rate_per_node_day / 86400.0
        return min(1.0, rate_s * self.cost_s(step_s, evict_mttr_s))
