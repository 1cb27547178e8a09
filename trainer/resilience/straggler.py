"""Straggler detection: which node makes every step wait, and whether to evict it into a hot spare.

Every step ends in the library's one collective (the step's all_reduce, trainer/runtime/step_check.py).
Each rank measures its **compute** (from the step's start to its arrival at that collective: the team's
step and any slowness injected into it) and its **wait** (how long it then sat in the collective, i.e.
waited for slower ranks; known one step late). Both ride in that same all_reduce, one slot per rank, so
every rank holds every rank's figures after each step with no extra collective and scores them
identically.

Scores, per node (a node's compute is its slowest rank's):

* **peer score**: the node's compute divided by the median compute of the *other* nodes. The whole job
  slowing down (a slower data path, a throttled fabric) moves every node together and leaves every peer
  score near 1: a uniform slowdown is never a straggler. The other nodes' median, not all nodes', so
  that with two nodes the slow one scores its full factor.
* **history**: the node's compute over its own baseline (its median over its first full window). It is
  reported with a finding, so an operator sees whether the node got slower or was always slow.

A node is a straggler when the median of its peer scores over the last `WINDOW` steps is at least
`THRESHOLD` (one slow step, a GC pause or a save, does not count), or, sooner, when each of its last
`FAST_STEPS` consecutive scores is at least `FAST_THRESHOLD`: a node plainly twice as slow as its peers
step after step is found after three steps instead of a window's eight (every slow step it stays costs
the whole job that step's excess), while noise stays under the window's rule (a single slow step breaks
the run). At most one node is reported per step (the highest score, lowest node on ties), so every rank
names the same one, and a node is reported again only after another full window.

Each step's **excess** (`StragglerScorer.excess_s`) is what that step waited for a straggling node: the
slowest node's compute beyond the other nodes' median when its peer score is at least `THRESHOLD`, else 0.
Rank 0 writes it in the step's event (`straggler_s`), and the run's summary counts it as lost, not
productive (trainer/events/metrics.py `loss_breakdown`): a straggler that is only reported costs the job
its pace, and the efficiency says so.

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

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import torch

from trainer.resilience.straggler_policy import StragglerPolicy

THRESHOLD = 1.5
"""A node is a straggler when its window's median peer score is at least this. Well above the spread of
healthy nodes (a few percent on GPUs, 10-20 % on 2 loaded CPU cores), well below a throttled GPU's 2x."""
WINDOW = 8
"""Steps a score must stay past the threshold; also the least distance between two evictions."""
FAST_STEPS = 3
"""Consecutive scored steps, each at least FAST_THRESHOLD, that make a straggler before a full window."""
FAST_THRESHOLD = 2.0
"""The per-step peer score of the fast rule: a throttled GPU's 2x and more, above what noise reaches in a
row (the window's rule, at THRESHOLD, finds the milder stragglers)."""
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
    steps: int = WINDOW
    """The scored steps the finding stands on: WINDOW (the window's median) or FAST_STEPS (the fast rule)."""


def node_of(rank: int, ranks_per_node: int) -> int:
    """Launchers number ranks node by node: the node (group rank) of a global rank."""
    return rank // ranks_per_node


class StragglerScorer:
    """Scores each step's per-rank timings (see the module docstring). Every rank keeps one and feeds it
    the same all-reduced figures, so every rank finds the same stragglers at the same step.

    The windows are tensors of `window x nodes` (ring buffers), so a step costs a few vector operations
    whatever the node count (about a millisecond at 2,048 nodes), not a Python loop over the nodes."""

    def __init__(
        self,
        world_size: int,
        ranks_per_node: int,
        threshold: float = THRESHOLD,
        window: int = WINDOW,
        warmup: int = WARMUP,
        fast_steps: int = FAST_STEPS,
        fast_threshold: float = FAST_THRESHOLD,
    ) -> None:
        self.world_size, self.ranks_per_node = world_size, ranks_per_node
        self.threshold, self.window, self.warmup = threshold, window, warmup
        self.fast_steps, self.fast_threshold = min(fast_steps, window), fast_threshold
        self.nodes = max(1, world_size // ranks_per_node)
        shape = (window, self.nodes)
        self._scores = torch.zeros(shape, dtype=torch.float64)
        self._compute = torch.zeros(shape, dtype=torch.float64)
        self._waits = torch.zeros(shape, dtype=torch.float64)
        self._baseline: torch.Tensor | None = None
        self._filled = 0  # steps scored, up to the window
        self._seen = 0
        self._slot = -1  # the ring buffer's newest row
        self._last_report = torch.full((self.nodes,), -(10**9), dtype=torch.int64)
        self.excess_s = 0.0
        """The last step's wait for a straggling node (module docstring); 0 in the warm-up."""
        self.last_scores: torch.Tensor | None = None
        """The last scored step's peer score per node (None in the warm-up)."""

    def add(
        self, step: int, compute: Sequence[float] | torch.Tensor, wait: Sequence[float] | torch.Tensor
    ) -> Finding | None:
        """One step's compute and wait per rank (seconds); the straggler it completes, if any."""
        self._seen += 1
        self.excess_s = 0.0
        if self._seen <= self.warmup or self.nodes < 2:
            return None
        used = self.nodes * self.ranks_per_node
        per_rank = torch.as_tensor(compute, dtype=torch.float64)[:used].view(self.nodes, self.ranks_per_node)
        per_node = per_rank.amax(dim=1)  # a node is as slow as its slowest rank
        waits = torch.as_tensor(wait, dtype=torch.float64)[:used].view(self.nodes, self.ranks_per_node)
        others = medians_without_each(per_node)
        score = torch.where(others > 0, per_node / others.clamp_min(1e-12), torch.ones_like(per_node))
        top = int(torch.argmax(score))
        if float(score[top]) >= self.threshold:
            self.excess_s = max(0.0, float(per_node[top] - others[top]))
        self.last_scores = score
        self._slot = (self._seen - self.warmup - 1) % self.window
        self._scores[self._slot], self._compute[self._slot] = score, per_node
        self._waits[self._slot] = waits.amin(dim=1)
        self._filled = min(self._filled + 1, self.window)
        if self._filled == self.window and self._baseline is None:
            self._baseline = _median(self._compute)
        due = step - self._last_report >= self.window
        if self._filled == self.window:
            found = self._window_finding(step, due)
            if found is not None:
                return found
        return self._fast_finding(step, due)

    def _window_finding(self, step: int, due: torch.Tensor) -> Finding | None:
        # The window's median can reach the threshold only with half its scores past it: the median of
        # thousands of healthy nodes is never computed.
        over = (self._scores >= self.threshold).sum(dim=0) >= self.window // 2
        candidates = torch.nonzero(over & due).flatten()
        if candidates.numel() == 0:
            return None
        medians = _median(self._scores[:, candidates])
        best = int(torch.argmax(medians))  # the first of equal maxima: the lowest node
        if float(medians[best]) < self.threshold:
            return None
        return self._report(step, int(candidates[best]), float(medians[best]), self._rows(self.window))

    def _fast_finding(self, step: int, due: torch.Tensor) -> Finding | None:
        """Each of the last `fast_steps` scores of a node at least `fast_threshold` (none before that many
        steps were scored)."""
        if self._filled < self.fast_steps:
            return None
        rows = self._rows(self.fast_steps)
        recent = self._scores[rows]
        candidates = torch.nonzero((recent >= self.fast_threshold).all(dim=0) & due).flatten()
        if candidates.numel() == 0:
            return None
        medians = _median(recent[:, candidates])
        best = int(torch.argmax(medians))
        return self._report(step, int(candidates[best]), float(medians[best]), rows)

    def _rows(self, n: int) -> torch.Tensor:
        """The ring buffer's rows of the last `n` scored steps."""
        return torch.remainder(self._slot - torch.arange(n), self.window)

    def _report(self, step: int, node: int, score: float, rows: torch.Tensor) -> Finding:
        self._last_report[node] = step
        compute = float(_median(self._compute[rows, node : node + 1])[0])
        # Before a full window the baseline is the node's median over the steps scored so far.
        base = self._baseline if self._baseline is not None else _median(self._compute[: self._filled])
        baseline = float(base[node])
        waits = self._waits[rows]
        peer_waits = torch.cat([_median(waits[:, :node]), _median(waits[:, node + 1 :])])
        first = node * self.ranks_per_node
        return Finding(
            step=step,
            node=node,
            ranks=tuple(range(first, first + self.ranks_per_node)),
            score=round(score, 3),
            history=round(compute / baseline, 3) if baseline > 0 else 1.0,
            compute_s=round(compute, 6),
            peer_wait_s=round(float(_median(peer_waits[:, None])[0]), 6),
            steps=int(rows.numel()),
        )


def _median(columns: torch.Tensor) -> torch.Tensor:
    """Each column's median, the mean of the middle two for an even count (as `statistics.median`)."""
    if columns.shape[-1] == 0:
        return columns.new_zeros(0)
    return torch.quantile(columns, 0.5, dim=0)


def medians_without_each(values: torch.Tensor) -> torch.Tensor:
    """For each entry, the median of all the other entries (one sort, not one per entry)."""
    ranked, order = torch.sort(values)
    position = torch.empty_like(order)
    position[order] = torch.arange(values.numel())
    n = values.numel() - 1

    def at(j: int) -> torch.Tensor:  # the j-th smallest of the others, per entry
        return torch.where(position > j, ranked[j], ranked[min(j + 1, values.numel() - 1)])

    return at(n // 2) if n % 2 else (at(n // 2 - 1) + at(n // 2)) / 2


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
