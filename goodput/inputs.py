"""The planner's cluster-scale defaults, each with its source, and the rollbacks read from measurements.

Defaults are for Llama 3 405B pre-training on 16,384 H100 (the planner's headline case). Where no
published figure exists the value is an assumption and says so; ``python -m goodput --help`` names
the option that replaces it.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from goodput.model import PlanError
from goodput.node_loss import FSX_READ_S, node_loss_mttr

# Llama 3 405B step time: 16M tokens per step (Llama Team, arXiv:2407.21783, section 3.4.1: batch
# raised to 16M tokens) at about 400 TFLOPS per GPU on 16,384 H100 (Table 4), with the usual 6 FLOPs
# per parameter and token: 6 * 405e9 * 16.8e6 / (16384 * 400e12) = 6.2 s.
STEP_S = 6 * 405e9 * 16.8e6 / (16384 * 400e12)

# Fault shares from the root causes of the 419 unexpected interruptions (arXiv:2407.21783, Table 5):
# software bugs (54), NCCL watchdog timeouts (7) and dependency failures (2) leave the node healthy:
# the process survives them (tier 1, in-process, restores from its own memory). The other 356 are
# hardware (GPU, HBM3, SRAM, network switch/cable, host maintenance, ...): the node is drained and a
# hot spare takes its place, restoring from the peer replica. Three of those needed significant
# manual intervention (section 3.3.4): a job restart from the durable checkpoint.
# Six of the hardware interruptions were silent data corruptions (Table 5): with the numerical guard
# (trainer/resilience/guard.py) the step they corrupt is rolled back from the in-memory snapshot in the
# same processes, no node replaced (a node is only reported suspect when its ranks corrupt steps again).
# Assumption: every one of them shows as a non-finite or spiking loss or gradient norm the guard sees; a
# corruption that stays below the spike factor is trained on, as it is without a guard.
SOFTWARE, HARDWARE, CORRUPTION, MANUAL = 63, 353 - 6, 6, 3
# MTTRs at scale: 30 s for an in-process restart (assumption), 900 s for a job restart (scheduling, new
# nodes, image pull, start-up, load; assumption). A node loss is the sum of its parts at 16,384 GPUs
# (goodput/node_loss.py: detection, rendezvous at 2,048 nodes from bench.scale, process start, restore
# from the peer, NCCL/EFA start-up; each measured or a stated assumption with its source), plus 60 s to
# read the durable checkpoint when the replica is gone.
NODE_LOSS_MTTR_S = round(node_loss_mttr(16_384))
# A guard rollback at scale (assumption): detection is the tripped step itself; the restore agreement (one
# all_gather of a few integers over 16,384 ranks) and the copy of 0.37 GiB per GPU back from host memory
# take well under a second; 5 s leaves room for the slowest rank. Measured on CPU: rollback_s of the
# `guard_rollback` event (0.09 s from memory for the tiny model, bench's guard part measures the per-step
# cost, not this). The recompute since the snapshot is the planner's snapshot lag, as for any memory tier.
GUARD_ROLLBACK_S = 5.0
DEFAULT_TIERS = (
    f"in-process:share={SOFTWARE}/419:mttr=30:rollback=memory:source=memory",
    f"node-loss:share={HARDWARE}/419:mttr={NODE_LOSS_MTTR_S}:rollback=peer:source=peer"
    f":fallback-mttr={NODE_LOSS_MTTR_S + round(FSX_READ_S)}",
    f"job-restart:share={MANUAL}/419:mttr=900:rollback=checkpoint",
    f"corruption:share={CORRUPTION}/419:mttr={GUARD_ROLLBACK_S:g}:rollback=memory:source=memory",
)

# Where a memory or peer tier's measured rollback comes from, by the restore event's `source`.
SOURCES = ("memory", "shm", "peer", "local", "fsx")

# Steps recomputed per fault when no measurement is given: none beyond the step in flight (the
# snapshot is taken after every step); the planner adds the step in flight and the snapshot lag.
DEFAULT_STEPS = 0.0

# Per-GPU snapshot: 405e9 parameters x 16 bytes (bf16 weights, fp32 master weights and two AdamW
# moments) sharded over 16,384 GPUs = 0.37 GiB per GPU.
STATE_GIB_PER_GPU = 405e9 * 16 / 16384 / 2**30
# Device-to-host copy rate per GPU (assumption): PCIe 5.0 x16 carries 64 GB/s per direction; pinned
# copies from eight GPUs at once through the host's memory get about half of that: 25 GB/s.
D2H_GB_S = 25.0
# Blocked time of one snapshot over the one-copy floor when no measurement is given: the target
# (<= 1.5x the floor); bench.snapshot's measured ratio replaces it (--rollback-from snapshot.json).
BLOCKED_OVER_FLOOR = 1.5

# Probability that one event loses a node and the peer holding its replica (assumption, an upper
# bound): every network switch/cable interruption of Table 5 (35 of the 356 hardware ones) taking the
# pair, as for peers behind one switch. Peers in another rack bring it towards 0.
PEER_CORRELATED = 35 / 356
REPLICAS = 1  # a ring: each node's snapshot on the next node


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def fault_records(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Per-fault records (``restored_from``, ``steps_recomputed``) of a measurements file: bench.snapshot's
    ``faults``, a run's summary.json ``faults`` or bench.recovery's ``runs`` (those that say where they
    restored from). Unsuccessful runs are left out."""
    records = list(result.get("faults") or []) + list(result.get("runs") or [])
    return [
        r
        for r in records
        if r.get("ok", True) and r.get("restored_from") and r.get("steps_recomputed") is not None
    ]


def measured_rollbacks(paths: Iterable[Path]) -> dict[str, dict[str, float]]:
    """Steps recomputed per fault by restore source (median, min, max, n) over the files ``paths``."""
    by_source: dict[str, list[float]] = {}
    for path in paths:
        try:
            result = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as err:
            raise PlanError(f"--rollback-from {path}: {err}") from err
        for r in fault_records(result):
            by_source.setdefault(str(r["restored_from"]), []).append(float(r["steps_recomputed"]))
    return {s: _spread(v) for s, v in sorted(by_source.items())}


def measured_blocked_over_floor(paths: Iterable[Path]) -> tuple[float, int] | None:
    """bench.snapshot's blocked time over the one-copy floor at its largest size (ratio, MiB per rank)."""
    found = None
    for path in paths:
        result = json.loads(Path(path).read_text())
        rows = [r for r in result.get("rows") or [] if r.get("blocked_over_floor")]
        if rows:
            top = max(rows, key=lambda r: r["mib"])
            found = (float(top["blocked_over_floor"]), int(top["mib"]))
    return found
