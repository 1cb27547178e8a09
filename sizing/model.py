"""The sizing: from checkpoint bytes, the file system and the cadence to times, capacities and problems.

Durable checkpoints go to FSx (directly, or drained from each node's NVMe tier): the rate is the lower of
the file system's baseline and the nodes' own client rate (nodes x `node_mbps`). A checkpoint must be
durable before the next one starts (the trainer waits for the previous save), so the shortest interval
the file system sustains is one write time. The file system holds `keep` committed checkpoints plus the
one being written (retention prunes after the commit), plus `headroom` for the data and run output; each
node's NVMe tier holds its share of the same `keep + 1` steps.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from sizing.fsx import (
    LARGEST_CAPACITY_GIB,
    PERSISTENT_2_THROUGHPUTS,
    baseline_mbps,
    burst_mbps,
    fsx_tib,
    smallest_valid_capacity_gib,
)

GIB = 2**30
MB = 1e6  # AWS quotes FSx throughput in MB/s of 10^6 bytes

# A node's Lustre client rate (MB/s) when the team gives none: an assumption, not a published figure. One
# client moves a few GB/s over the instance's ENA network (FSx traffic does not use EFA here); the smoke
# run's storage step measures the real figure (docs/infra.md).
DEFAULT_NODE_MBPS = 2000.0
# Share of the file system left for the training data, run output and Lustre's own reserve.
DEFAULT_HEADROOM = 0.2
# Device-to-host copy rate per GPU (GB/s) that stages a save before the async write (goodput/inputs.py's
# assumption, copied): the part of a save the loop waits for when the writes keep up.
DEFAULT_D2H_GB_S = 25.0


@dataclass(frozen=True)
class SizingInputs:
    """What the sizing needs; every figure a team states or the defaults of sizing.teamfile."""

    checkpoint_bytes: int
    nodes: int
    """Training nodes (hot spares hold no checkpoint shards)."""
    gpus_per_node: int
    fsx_gib: int
    throughput_per_tib: int
    interval_s: float
    """Seconds between checkpoint saves."""
    keep: int
    """Committed checkpoints kept (`ckptKeep`)."""
    step_s: float | None = None
    """Seconds per step, to state an interval in steps; None: minutes only."""
    node_mbps: float = DEFAULT_NODE_MBPS
    """Each node's FSx client rate, MB/s: its NVMe drain and its share of a reload."""
    nvme_gib_per_node: float | None = None
    """The node's NVMe RAID capacity (the local tier); None: not checked."""
    reload_budget_s: float | None = None
    """Whole-job reload time above which a warning is given; None: no warning."""
    headroom: float = DEFAULT_HEADROOM
    d2h_gb_s: float = DEFAULT_D2H_GB_S

    def __post_init__(self) -> None:
        for name in ("checkpoint_bytes", "nodes", "gpus_per_node", "fsx_gib", "keep"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        for name in ("interval_s", "node_mbps", "d2h_gb_s"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and value > 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
        for name in ("step_s", "nvme_gib_per_node", "reload_budget_s"):
            value = getattr(self, name)
            if value is not None and not (value > 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a finite number > 0 or None, got {value!r}")
        if not 0 <= self.headroom < 1:
            raise ValueError(f"headroom must be in [0, 1), got {self.headroom!r}")
        if self.throughput_per_tib not in PERSISTENT_2_THROUGHPUTS:
            raise ValueError(f"throughput_per_tib must be one of {PERSISTENT_2_THROUGHPUTS}")


@dataclass(frozen=True)
class SizingResult:
    """The sizing's figures, and what is wrong (`problems`: stop) or slow (`warnings`: say so)."""

    inputs: SizingInputs
    fsx_mbps: float
    """The file system's baseline throughput, MB/s."""
    fsx_burst_mbps: float
    nodes_mbps: float
    """What the nodes' clients can move together, MB/s."""
    write_s: float
    """Seconds to make one checkpoint durable (baseline)."""
    burst_write_s: float
    reload_s: float
    """Seconds for every node to read the whole checkpoint back (a job restart)."""
    min_interval_s: float
    fsx_needed_gib: float
    nvme_needed_gib_per_node: float
    shard_bytes_per_rank: int
    stall_s: float
    """Seconds the loop is blocked per save: staging the rank's shard, plus any wait for the last save."""
    problems: tuple[str, ...] = field(default=())
    warnings: tuple[str, ...] = field(default=())

    @property
    def durable_mbps(self) -> float:
        return min(self.fsx_mbps, self.nodes_mbps)

    def as_dict(self) -> dict[str, object]:
        i = self.inputs
        return {
            "checkpoint_gb": i.checkpoint_bytes / 1e9,
            "shard_mb_per_rank": self.shard_bytes_per_rank / MB,
            "fsx_mbps": self.fsx_mbps,
            "fsx_burst_mbps": self.fsx_burst_mbps,
            "nodes_mbps": self.nodes_mbps,
            "durable_mbps": self.durable_mbps,
            "write_s": self.write_s,
            "burst_write_s": self.burst_write_s,
            "reload_s": self.reload_s,
            "interval_s": i.interval_s,
            "min_interval_s": self.min_interval_s,
            "fsx_gib": i.fsx_gib,
            "fsx_needed_gib": self.fsx_needed_gib,
            "nvme_needed_gib_per_node": self.nvme_needed_gib_per_node,
            "stall_s": self.stall_s,
            "problems": list(self.problems),
            "warnings": list(self.warnings),
        }


def _gb(n_bytes: float) -> str:
    return f"{n_bytes / 1e9:,.1f} GB"


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _interval_setting(seconds: float, step_s: float | None) -> str:
    minutes = math.ceil(seconds / 60 * 10) / 10
    text = f"checkpoints.interval_minutes >= {minutes:g}"
    if step_s:
        text += f" (interval_steps >= {math.ceil(seconds / step_s)} at {step_s:g} s/step)"
    return text


def _write_fixes(i: SizingInputs, nodes_mbps: float, needed_mbps: float, needed_gib: float) -> str:
    """The smallest settings that make one checkpoint durable within the interval."""
    fixes = [
        _interval_setting(
            i.checkpoint_bytes / min(baseline_mbps(i.fsx_gib, i.throughput_per_tib), nodes_mbps) / MB,
            i.step_s,
        )
    ]
    if nodes_mbps < needed_mbps:
        fixes.append(
            f"the nodes' clients move only {nodes_mbps:,.0f} MB/s together ({i.nodes} x "
            f"checkpoints.node_mbps {i.node_mbps:g}): more nodes or a longer interval"
        )
        return "; ".join(fixes)
    per_tib = next((t for t in PERSISTENT_2_THROUGHPUTS if baseline_mbps(i.fsx_gib, t) >= needed_mbps), None)
    if per_tib is not None and per_tib != i.throughput_per_tib:
        fixes.append(f"fsx.throughput_per_tib {per_tib}")
    capacity = smallest_valid_capacity_gib(max(needed_mbps / i.throughput_per_tib * 1000, needed_gib))
    if capacity <= LARGEST_CAPACITY_GIB:
        fixes.append(f"fsx.storage_gib {capacity}")
    return " or ".join(fixes)


def size(i: SizingInputs) -> SizingResult:
    """Every figure of the sizing, with the problems (one line each) and warnings it finds."""
    ckpt = i.checkpoint_bytes
    fsx = baseline_mbps(i.fsx_gib, i.throughput_per_tib)
    burst = burst_mbps(i.fsx_gib, i.throughput_per_tib)
    nodes_mbps = i.nodes * i.node_mbps
    durable = min(fsx, nodes_mbps)
    write_s = ckpt / (durable * MB)
    burst_write_s = ckpt / (min(burst, nodes_mbps) * MB)
    reload_s = ckpt / (durable * MB)  # uncached reads: min(network, disk) = the disk baseline
    ranks = i.nodes * i.gpus_per_node
    shard = math.ceil(ckpt / ranks)
    in_flight = i.keep + 1
    needed_gib = in_flight * ckpt / GIB / (1 - i.headroom)
    nvme_gib = in_flight * ckpt / i.nodes / GIB
    stall_s = shard / (i.d2h_gb_s * 1e9) + max(0.0, write_s - i.interval_s)

    problems = []
    if write_s > i.interval_s:
        needed_mbps = ckpt / i.interval_s / MB
        problems.append(
            f"one checkpoint ({_gb(ckpt)}) takes {_duration(write_s)} to write at {durable:,.0f} MB/s "
            f"(fsx.storage_gib {i.fsx_gib} = {fsx_tib(i.fsx_gib):g} TiB x fsx.throughput_per_tib "
            f"{i.throughput_per_tib} MB/s/TiB = {fsx:,.0f} MB/s) but the checkpoint interval is "
            f"{_duration(i.interval_s)} (needs {needed_mbps:,.0f} MB/s); smallest valid: "
            + _write_fixes(i, nodes_mbps, needed_mbps, needed_gib)
        )
    if needed_gib > i.fsx_gib:
        most_keep = math.floor(i.fsx_gib * (1 - i.headroom) * GIB / ckpt) - 1
        keep_fix = f" or checkpoints.keep {most_keep}" if most_keep >= 1 else ""
        problems.append(
            f"checkpoints.keep {i.keep} checkpoints of {_gb(ckpt)} plus the one being written need "
            f"{needed_gib:,.0f} GiB with {i.headroom:.0%} headroom, but fsx.storage_gib is {i.fsx_gib}; "
            f"smallest valid: fsx.storage_gib {smallest_valid_capacity_gib(needed_gib)}{keep_fix}"
        )
    if i.nvme_gib_per_node is not None and nvme_gib > i.nvme_gib_per_node:
        problems.append(
            f"the NVMe tier holds checkpoints.keep {i.keep} + 1 checkpoints: {nvme_gib:,.0f} GiB per node "
            f"({i.nodes} nodes), above the node's {i.nvme_gib_per_node:,.0f} GiB; smallest valid: "
            f"checkpoints.keep {max(1, math.floor(i.nvme_gib_per_node * GIB * i.nodes / ckpt) - 1)}"
        )
    warnings = []
    if i.reload_budget_s is not None and reload_s > i.reload_budget_s:
        needed_mbps = ckpt / i.reload_budget_s / MB
        per_tib = next(
            (
                t
                for t in PERSISTENT_2_THROUGHPUTS
                if min(baseline_mbps(i.fsx_gib, t), nodes_mbps) >= needed_mbps
            ),
            None,
        )
        hint = ""
        if per_tib:
            faster = ckpt / min(baseline_mbps(i.fsx_gib, per_tib), nodes_mbps) / MB
            hint = f"; fsx.throughput_per_tib {per_tib} would take {_duration(faster)}"
        warnings.append(
            f"reloading the whole job ({_gb(ckpt)} at {durable:,.0f} MB/s) takes {_duration(reload_s)}, "
            f"above checkpoints.reload_budget_minutes {i.reload_budget_s / 60:g}{hint}"
        )
    return SizingResult(
        inputs=i,
        fsx_mbps=fsx,
        fsx_burst_mbps=burst,
        nodes_mbps=nodes_mbps,
        write_s=write_s,
        burst_write_s=burst_write_s,
        reload_s=reload_s,
        min_interval_s=write_s,
        fsx_needed_gib=needed_gib,
        nvme_needed_gib_per_node=nvme_gib,
        shard_bytes_per_rank=shard,
        stall_s=stall_s,
        problems=tuple(problems),
        warnings=tuple(warnings),
    )
