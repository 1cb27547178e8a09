"""The node-loss MTTR as a sum of parts, each measured or a stated assumption with its source.

A node lost on a cluster (the planner's largest loss term) costs, from the fault to the first step after
it, with a hot spare already up (its pod runs the zygote that imported the trainer, trainer/prefork):

1. detection: the survivors' in-process Wrapper finds a rank that vanished when its monitor process has
   been silent for the liveness timeout (chart ``inprocessLivenessTimeout``, 10 s), then leaves to
   ft_launcher (tier 2);
2. rendezvous of the launchers at N nodes: the barrier rendezvous's store work and polls, from
   ``bench.scale``'s fit (``python -m bench --only scale``), plus the chart's ``rdzvLastCallTimeout``
   (1 s: with hot spares the host waits that long for the previous round's nodes);
3. process start: bench.recovery's measured tier-2 worker restart on CPU (``sigkill/tier2``, median
   0.55 s on a quiet machine, 3.27 s in an earlier loaded run; itself including a one-node rendezvous
   and a /dev/shm restore: an upper bound of the CPU part), plus CUDA context creation and the sharded
   model build on a GPU node (assumption: 10 s; not measured here: no GPU);
4. restore from the peer: the lost node's snapshot (8 GPUs x the per-GPU state) pulled from the node
   that keeps its replica over the pod network (assumption: 5 GB/s per node, half of the 100 Gbps a
   p5's pod network carries);
5. NCCL/EFA start-up of the new process group: stock NCCL's bootstrap and connection set-up take about
   265 s at 96k GPUs and grow super-linearly (Si et al., "Collective Communication for 100k+ GPUs",
   Meta, arXiv:2510.20171, on RoCE): scaled linearly to G GPUs (assumption; super-linear growth would
   make it smaller below 96k, so linear is the cautious choice).

The planner's default node-loss tier takes ``node_loss_mttr(16_384)``; its fallback (the replica lost
too) adds the durable checkpoint's read (``FSX_READ_S``).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from goodput.model import PlanError

GPUS_PER_NODE = 8
LIVENESS_TIMEOUT_S = 10.0  # chart inprocessLivenessTimeout
LAST_CALL_S = 1.0  # chart rdzvLastCallTimeout
# bench.scale's rendezvous round (store work + the 0.1 s polls) fitted as a * nodes^k; these defaults are
# its quick pass on a loaded 2-core machine (8-128 nodes): replaced by a scale.json given to
# `rendezvous_fit_from`.
RENDEZVOUS_FIT = {"a": 0.162, "k": 0.205}
# bench.recovery sigkill/tier2 median, quiet machine (bench/results/recovery.json, 2026-12-02; 3.27 s loaded)
CPU_RESTART_S = 0.55
GPU_START_S = 10.0  # assumption: CUDA context + FSDP2 model build on an H100 node
STATE_GIB_PER_GPU = 405e9 * 16 / 16384 / 2**30  # as goodput.inputs: Llama 3 405B state over 16,384 GPUs
PEER_GB_S = 5.0  # assumption: pod network rate of one node's pull
NCCL_REFERENCE_S, NCCL_REFERENCE_GPUS = 265.0, 98_304  # arXiv:2510.20171: stock NCCL init at 96k GPUs
NCCL_EXPONENT = 1.0  # assumption (see the module doc)
FSX_READ_S = 60.0  # as goodput.inputs: read the durable checkpoint when the replica is gone too


@dataclass(frozen=True)
class NodeLossParts:
    """Seconds per part of one node loss's recovery (module doc), and their sum."""

    gpus: int
    detection_s: float
    rendezvous_s: float
    process_start_s: float
    restore_s: float
    collective_start_s: float

    @property
    def total_s(self) -> float:
        return (
            self.detection_s + self.rendezvous_s + self.process_start_s + self.restore_s
            + self.collective_start_s
        )  # fmt: skip

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "total_s": self.total_s, "sources": SOURCES}


SOURCES = {
    "detection_s": "chart inprocessLivenessTimeout (10 s): the Wrapper's monitor of a vanished rank",
    "rendezvous_s": "bench.scale fit of the barrier rendezvous round at N nodes + rdzvLastCallTimeout (1 s)",
    "process_start_s": "bench.recovery sigkill/tier2 on CPU (0.55 s) + 10 s CUDA/model build (assumed)",
    "restore_s": "8 x 0.37 GiB (Llama 3 405B state per GPU at 16k GPUs) over 5 GB/s (assumed)",
    "collective_start_s": "stock NCCL init ~265 s at 96k GPUs (arXiv:2510.20171), scaled linearly (assumed)",
}


def rendezvous_fit_from(path: str | Path) -> dict[str, float]:
    """The rendezvous round's fit {"a", "k"} from a bench.scale result (``scale.json``)."""
    try:
        result = json.loads(Path(path).read_text())
        (f,) = [f for f in result["fits"] if f["series"] == "rendezvous round (store work + polls)"]
        return {"a": float(f["a"]), "k": float(f["exponent"])}
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise PlanError(f"{path}: no rendezvous fit of bench.scale ({err})") from err


def node_loss_parts(gpus: int, rendezvous_fit: dict[str, float] | None = None) -> NodeLossParts:
    """The parts of a node loss's recovery on a job of `gpus` GPUs (module doc)."""
    if gpus < GPUS_PER_NODE:
        raise PlanError(f"gpus must be at least {GPUS_PER_NODE}, got {gpus}")
    fit = rendezvous_fit or RENDEZVOUS_FIT
    nodes = gpus / GPUS_PER_NODE
    node_gb = GPUS_PER_NODE * STATE_GIB_PER_GPU * 2**30 / 1e9
    return NodeLossParts(
        gpus=gpus,
        detection_s=LIVENESS_TIMEOUT_S,
        rendezvous_s=fit["a"] * nodes ** fit["k"] + LAST_CALL_S,
        process_start_s=CPU_RESTART_S + GPU_START_S,
        restore_s=node_gb / PEER_GB_S,
        collective_start_s=NCCL_REFERENCE_S * (gpus / NCCL_REFERENCE_GPUS) ** NCCL_EXPONENT,
    )


def node_loss_mttr(gpus: int, rendezvous_fit: dict[str, float] | None = None) -> float:
    """Seconds from a node loss to the first step after it on `gpus` GPUs."""
    return node_loss_parts(gpus, rendezvous_fit).total_s
