"""The step loop's straggler watch: each rank's compute and wait per step, carried in the loop's one
collective, scored (trainer/resilience/straggler.py) and acted on.

`buffer` is this watch's part of the loop's step-end all_reduce buffer (trainer/runtime/step_check.py
`StepCheck.extra`, after the loss and the numerical guard's numbers): one slot per rank for its compute
this step and one per rank for its wait in the previous step's collective (`slots`). A rank writes only
its own slots (the SUM of a vector where each slot has one writer is exact in any order), so every rank
reads the same figures, finds the same straggler at the same step, and no collective is added.

Every step, `straggler_s` is the scorer's excess (what the step waited for a straggling node); rank 0
writes it in the step's event, and the summary counts it as lost time.

The eviction needs to know that a hot spare stands by, and asking takes `spare_standing_by`'s 1.5 s (a
standby counter must be seen to change) while every peer waits in the next collective. So local rank 0 of
a node that scored past the threshold asks in a background thread while the steps go on
(`SpareProbe`), again after each answer while the node stays past it; at the finding it takes an answer
at most `SPARE_FRESH_S` old, or asks then.

On a finding, every rank reports the node suspect (trainer/resilience/suspect.py: the `node_suspect`
event and metric the numerical guard's suspects share, and the handlers registered there). Under the
evict policy the straggling node's ranks wait until the step is kept and its snapshot's replica reached
their ring neighbour (`after_step`), so the spare resumes from that step and nothing is recomputed; then
local rank 0 of the node (alone: one `straggler` event per finding) asks whether a hot spare stands by
(trainer/resilience/liveness.py `spare_standing_by`), applies the policy (`decide`) and, to evict,
records the eviction and asks its pod's supervisor to leave (SIGUSR1: trainer/launcher/supervise.py ends
ft_launcher and its workers and exits `EVICTED_EXIT`). The peers then see a node loss and recover as from
one: the spare takes the node's place and restores from the replica the ring neighbour keeps.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from trainer.resilience import suspect
from trainer.resilience.straggler import THRESHOLD, WINDOW, Finding, StragglerScorer, decide

if TYPE_CHECKING:
    from trainer.config.train_config import TrainConfig
    from trainer.events.metrics import EventLog
    from trainer.runtime.faults import FaultInjector
    from trainer.runtime.session import ProcessInfo

log = logging.getLogger(__name__)

EVICT_WAIT_S = 60.0
"""How long an evicting rank waits for its supervisor to end it before it raises instead."""
EVICT_FLUSH_S = 10.0
"""How long a straggling node's rank waits for its step's snapshot to reach its peer before its pod leaves
(longer: it leaves anyway, and the spare resumes from the snapshot before)."""
SPARE_FRESH_S = 5.0
"""The oldest answer of the background spare probe an eviction takes (older: it asks again, and waits)."""


def slots(world_size: int) -> int:
    """The all_reduce slots the watch needs: each rank's compute and wait."""
    return 2 * world_size


class StragglerWatch:
    """One attempt's timings and scorer (new with each attempt: its first steps are the warm-up)."""

    def __init__(
        self,
        cfg: TrainConfig,
        proc: ProcessInfo,
        events: EventLog,
        faults: FaultInjector,
        buffer: torch.Tensor,
    ) -> None:
        self.proc, self.events, self.faults, self.device = proc, events, faults, buffer.device
        self.policy = cfg.run.straggler_policy
        self.ranks_per_node = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
        self.scorer = StragglerScorer(proc.world_size, self.ranks_per_node)
        if buffer.numel() != slots(proc.world_size):
            raise ValueError(f"straggler watch: {buffer.numel()} slots for {proc.world_size} ranks")
        self.buffer = buffer
        self.evictions = cfg.run.out_dir / "straggler" / "evictions.jsonl"
        self._wait = 0.0
        self.straggler_s = 0.0
        """This step's wait for a straggling node (the scorer's excess): the step event's `straggler_s`."""
        self.probe = SpareProbe(_spare_standing_by)
        self._found: Finding | None = None

    def arrive(self, step: int, t_start: float) -> None:
        """This rank reached the step's collective: fill its slots (after a `slow` fault's delay)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)  # the step's kernels are its compute, not its wait
        compute = time.time() - t_start
        factor = self.faults.slow_factor(step)
        if factor > 1.0:
            time.sleep((factor - 1.0) * compute)
            compute *= factor
        world, rank = self.proc.world_size, self.proc.rank
        self.buffer.zero_()
        self.buffer[rank] = compute
        self.buffer[world + rank] = self._wait

    def reduced(self, step: int, wait_s: float) -> None:
        """The collective returned after `wait_s`: score the step's figures and act on a finding."""
        self._wait = wait_s
        world = self.proc.world_size
        figures = self.buffer.to("cpu", torch.float64)
        finding = self.scorer.add(step, figures[:world], figures[world:])
        self.straggler_s = self.scorer.excess_s
        self._probe_if_suspect()
        if finding is None:
            return
        why = (
            f"{finding.score:.2f}x its peers' compute over {finding.steps} steps "
            f"(threshold {THRESHOLD}x over {WINDOW} or {self.scorer.fast_threshold}x in each of "
            f"{self.scorer.fast_steps}, ranks {list(finding.ranks)})"
        )
        suspect.report(
            suspect.SuspectNode(finding.node, tuple(finding.ranks), "straggler", why, finding.step),
            self.events,
            rank=self.proc.rank,
        )
        if self.policy == "evict" and self.proc.rank in finding.ranks:
            self._found = finding  # acted on after this step's snapshot: `after_step`
        elif self.proc.rank == finding.ranks[0]:
            self._act(finding)

    def after_step(self, flush: Callable[[], object]) -> None:
        """After the step's snapshot (the loop calls it once the step is kept): the ranks of a node found
        this step under the evict policy `flush` (wait until their snapshot's replica reached their ring
        neighbour, so the spare resumes from this step, nothing recomputed), then the node's first rank
        acts. Its peers took this step's snapshot already and wait in the next step's collective."""
        finding, self._found = self._found, None
        if finding is None:
            return
        flush()
        if self.proc.rank == finding.ranks[0]:
            self._act(finding)

    def _probe_if_suspect(self) -> None:
        """Local rank 0 of a node past the threshold this step asks for a spare in the background."""
        scores = self.scorer.last_scores
        if self.policy != "evict" or scores is None or self.proc.rank % self.ranks_per_node:
            return
        node = self.proc.rank // self.ranks_per_node
        if node < scores.numel() and float(scores[node]) >= THRESHOLD:
            self.probe.start()

    def _act(self, finding: Finding) -> None:
        spare = self.policy == "evict" and self.probe.answer(SPARE_FRESH_S)
        action, reason = decide(
            self.policy,
            spare_standing_by=spare,
            step=finding.step,
            last_eviction=last_eviction(self.evictions),
        )
        log.warning(
            "straggler: node %d is %.2fx its peers over %d steps: %s (%s)",
            finding.node,
            finding.score,
            finding.steps,
            action,
            reason,
        )
        self.events.emit(
            "straggler",
            step=finding.step,
            node=finding.node,
            ranks=list(finding.ranks),
            score=finding.score,
            history=finding.history,
            compute_s=finding.compute_s,
            peer_wait_s=finding.peer_wait_s,
            threshold=THRESHOLD,
            window=finding.steps,
            policy=self.policy,
            action=action,
            reason=reason,
        )
        if action == "evict":
            self._evict(finding)

    def _evict(self, finding: Finding) -> None:
        from trainer.launcher.supervise import SUPERVISOR_PID_ENV

        self.evictions.parent.mkdir(parents=True, exist_ok=True)
        with open(self.evictions, "a") as fh:
            fh.write(json.dumps({"step": finding.step, "node": finding.node, "t": time.time()}) + "\n")
        supervisor = os.environ.get(SUPERVISOR_PID_ENV, "")
        if supervisor.isdigit() and int(supervisor) > 1:
            os.kill(int(supervisor), signal.SIGUSR1)
            time.sleep(EVICT_WAIT_S)  # the supervisor ends this process with its pod
        raise RuntimeError(f"straggler eviction of node {finding.node}: the pod's supervisor did not end it")


class SpareProbe:
    """`ask` (whether a hot spare stands by; slow) run in a background thread, one at a time."""

    def __init__(self, ask: Callable[[], bool], clock: Callable[[], float] = time.monotonic) -> None:
        self.ask, self.clock = ask, clock
        self._thread: threading.Thread | None = None
        self._answer: tuple[float, bool] | None = None  # (when it was answered, the answer)

    def start(self) -> None:
        """Ask in the background, unless a question is already out."""
        if self._thread is not None and self._thread.is_alive():
            return
        self._thread = threading.Thread(target=self._run, name="spare-probe", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        answer = self.ask()
        self._answer = (self.clock(), answer)

    def answer(self, fresh_s: float) -> bool:
        """An answer at most `fresh_s` old: the question out (waited for), or a new one asked now."""
        if self._thread is not None:
            self._thread.join()
        if self._answer is not None and self.clock() - self._answer[0] <= fresh_s:
            return self._answer[1]
        self._run()
        assert self._answer is not None
        return self._answer[1]


def _spare_standing_by() -> bool:
    """Whether a hot spare's launcher waits in the rendezvous (False outside trainer.launcher.ft)."""
    from trainer.resilience.liveness import LIVENESS_STORE_ENV, spare_standing_by, store_client

    endpoint = os.environ.get(LIVENESS_STORE_ENV)
    if not endpoint:
        return False
    try:
        return spare_standing_by(store_client(endpoint))
    except Exception as exc:  # the store is gone: no spare we could count on
        log.warning("straggler: could not ask for a hot spare: %s", exc)
        return False


def last_eviction(path: Path) -> int | None:
    """The step of the run's last eviction (any node, any attempt), or None."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    for line in reversed(lines):
        try:
            return int(json.loads(line)["step"])
        except (ValueError, KeyError, TypeError):
            continue
    return None
