"""Straggler detection: which node makes every step wait, and whether to evict it into a hot spare.

Every step ends in the library's one collective (the loss all_reduce of trainer/runtime/job.py). Each rank
measures its **compute** (from the step's start to its arrival at that collective: the team's step and
any slowness injected into it) and its **wait** (how long it then sat in the collective, i.e. waited for
slower ranks; known one step late). Both ride in that same all_reduce, one slot per rank, so every rank
holds every rank's figures after each step with no extra collective and scores them identically.

Scores, per node (a node's compute is its slowest rank's):

* **peer score**: the node's compute divided by the median compute of the *other* nodes. The whole job
  slowing down (a slower data path, a throttled fabric) moves every node together and leaves every peer
  score near 1: a uniform slowdown is never a straggler. The other nodes' median, not all nodes', so
  that with two nodes the slow one scores its full factor.
* **history**: the node's compute over its own baseline (its median over its first full window). It is
  reported with a finding, so an operator sees whether the node got slower or was always slow.

A node is a straggler when the median of its peer scores over the last `WINDOW` steps is at least
`THRESHOLD` (one slow step, a GC pause or a save, does not count). At most one node is reported per
step (the highest score, lowest node on ties), so every rank names the same one, and a node is reported
again only after another full window.

What the policy does with a finding is `decide` (pure; trainer/runtime/job.py acts on it): report only,
or evict when the policy is `evict`, a hot spare stands by, and no eviction happened within a window.
Eviction is the straggler's pod leaving cleanly (exit `EVICTED_EXIT` from its supervisor,
trainer/launcher/supervise.py): the spare takes its place exactly as after a node loss.

What the score cannot see: slowness that a rank's peers absorb inside the team's own collectives (an
FSDP all-gather waits for the slow rank, so every rank's compute grows alike up to the step's last
collective). What stays visible is the slow rank's work after that collective (the optimizer step, the
data, anything before `job.log`); NVRx's CUPTI-based detector sees kernels and needs CUDA.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

StragglerPolicy = Literal["report", "evict"]
POLICIES: tuple[str, ...] = ("report", "evict")

THRESHOLD = 1.5
"""A node is a straggler when its window's median peer score is at least this. Well above the spread of
healthy nodes (a few percent on GPUs, 10-20 % on 2 loaded CPU cores), well below a throttled GPU's 2x."""
WINDOW = 8
"""Steps a score must stay past the threshold; also the least distance between two evictions."""
WARMUP = 2
"""Steps of each attempt left out: the first steps build caches, plans and the snapshot's save dict."""
EVICTED_EXIT = 95
"""The exit status of an evicted straggler's pod: the chart's podFailurePolicy ignores it (the pod is
replaced without counting against the Job's failure budget), like a node loss's DisruptionTarget."""


@dataclass(frozen=True)
class Finding:
    """A node past the threshold for a window."""

    step: int
    node: int
    ranks: tuple[int, ...]
    score: float
    """The window's median peer score: the node's compute over the other nodes' median."""
    history: float
    """The node's compute over its own baseline (1.0: as slow as it always was)."""
    compute_s: float
    """The node's median compute per step over the window."""
    peer_wait_s: float
    """The other nodes' median wait in the step's collective over the window: what the node costs them."""


def node_of(rank: int, ranks_per_node: int) -> int:
    """Launchers number ranks node by node: the node (group rank) of a global rank."""
    return rank // ranks_per_node


@dataclass
class StragglerScorer:
    """Scores each step's per-rank timings (see the module docstring). Every rank keeps one and feeds it
    the same all-reduced figures, so every rank finds the same stragglers at the same step."""

    world_size: int
    ranks_per_node: int
    threshold: float = THRESHOLD
    window: int = WINDOW
    warmup: int = WARMUP
    _seen: int = field(default=0, init=False)
    _scores: dict[int, deque[float]] = field(default_factory=dict, init=False)
    _compute: dict[int, deque[float]] = field(default_factory=dict, init=False)
    _waits: dict[int, deque[float]] = field(default_factory=dict, init=False)
    _baseline: dict[int, float] = field(default_factory=dict, init=False)
    _last_report: dict[int, int] = field(default_factory=dict, init=False)

    @property
    def nodes(self) -> int:
        return max(1, self.world_size // self.ranks_per_node)

    def add(self, step: int, compute: Sequence[float], wait: Sequence[float]) -> Finding | None:
        """One step's compute and wait per rank (seconds); the straggler it completes, if any."""
        self._seen += 1
        if self._seen <= self.warmup or self.nodes < 2:
            return None
        per_node = [
            max(compute[n * self.ranks_per_node : (n + 1) * self.ranks_per_node]) for n in range(self.nodes)
        ]
        node_wait = [
            min(wait[n * self.ranks_per_node : (n + 1) * self.ranks_per_node]) for n in range(self.nodes)
        ]
        for node, own in enumerate(per_node):
            others = statistics.median(per_node[:node] + per_node[node + 1 :])
            self._push(self._scores, node, own / others if others > 0 else 1.0)
            self._push(self._compute, node, own)
            self._push(self._waits, node, node_wait[node])
            if node not in self._baseline and len(self._compute[node]) == self.window:
                self._baseline[node] = statistics.median(self._compute[node])
        return self._finding(step)

    def _push(self, table: dict[int, deque[float]], node: int, value: float) -> None:
        table.setdefault(node, deque(maxlen=self.window)).append(value)

    def _finding(self, step: int) -> Finding | None:
        best: tuple[float, int] | None = None
        for node, scores in self._scores.items():
            if len(scores) < self.window or step - self._last_report.get(node, -self.window) < self.window:
                continue
            score = statistics.median(scores)
            if score >= self.threshold and (best is None or score > best[0]):
                best = (score, node)
        if best is None:
            return None
        score, node = best
        self._last_report[node] = step
        compute = statistics.median(self._compute[node])
        baseline = self._baseline.get(node, compute)
        peers = [statistics.median(w) for n, w in self._waits.items() if n != node]
        first = node * self.ranks_per_node
        return Finding(
            step=step,
            node=node,
            ranks=tuple(range(first, first + self.ranks_per_node)),
            score=round(score, 3),
            history=round(compute / baseline, 3) if baseline > 0 else 1.0,
            compute_s=round(compute, 6),
            peer_wait_s=round(statistics.median(peers), 6) if peers else 0.0,
        )


Action = Literal["evict", "report"]


def decide(
    policy: StragglerPolicy,
    *,
    spare_standing_by: bool,
    step: int,
    last_eviction: int | None,
    window: int = WINDOW,
) -> tuple[Action, str]:
    """What to do with a finding at `step`: ("evict" | "report", why). The rules, each its own reason:
    the policy says report; no hot spare stands by (evicting would stop the job until a replacement
    pod came); the last eviction was less than a window ago (one node at a time: the job recovers and the
    scores settle before the next)."""
    if policy != "evict":
        return "report", "policy is report"
    if not spare_standing_by:
        return "report", "no hot spare stands by"
    if last_eviction is not None and step - last_eviction < window:
        return "report", f"a node was evicted at step {last_eviction}, less than {window} steps ago"
    return "evict", "a hot spare stands by"
