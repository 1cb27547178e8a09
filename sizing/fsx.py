"""FSx for Lustre PERSISTENT_2 (SSD) figures the sizing uses, each with its source (docs/infra.md cites them).

- Per-unit storage throughput: 125, 250, 500 or 1000 MB/s per TiB; file system throughput = storage
  capacity (TiB) x per-unit throughput (FSx API reference, `PerUnitStorageThroughput`; AWS's example: "a
  2.4-TiB file system, provisioning 50 MB/s/TiB ... yields 120 MB/s", i.e. 2400 GiB counted as 2.4 TiB,
  which is how `fsx_tib` counts).
- Writes, and reads that miss the file servers' cache, run at "the lower of the network throughput and
  disk throughput" (FSx for Lustre User Guide, Performance); the disk baseline is the per-unit figure, the
  lower one, so it is what a checkpoint write and a whole-job reload get when sustained.
- Disk burst (MB/s per TiB): 500 for PERSISTENT-125 and -250 (none above the baseline for -500 and -1000),
  network baseline 320/640/1300/2600 and burst 1300 for -125/-250 (User Guide, "Performance
  characteristics of SSD and HDD storage classes"). Bursts run on credits that a file system written
  continuously does not keep, so the checks use the baseline and report the burst for information.
- Capacity: 1200 GiB, 2400 GiB and increments of 2400 GiB (FSx API reference, `StorageCapacity`).
"""

from __future__ import annotations

import math

PERSISTENT_2_THROUGHPUTS = (125, 250, 500, 1000)
PERSISTENT_2_BURST_MBPS_PER_TIB = {125: 500, 250: 500, 500: 500, 1000: 1000}
PERSISTENT_2_NETWORK_MBPS_PER_TIB = {
    125: (320, 1300),
    250: (640, 1300),
    500: (1300, 1300),
    1000: (2600, 2600),
}
SMALLEST_CAPACITY_GIB = 1200
CAPACITY_STEP_GIB = 2400
LARGEST_CAPACITY_GIB = 2_400_000  # the teams file's ceiling (infra/teams/storage.py)


def fsx_tib(storage_gib: int) -> float:
    """Capacity in the TiB AWS multiplies the per-unit throughput by (2400 GiB -> 2.4)."""
    return storage_gib / 1000


def baseline_mbps(storage_gib: int, throughput_per_tib: int) -> float:
    """Sustained write (and uncached read) throughput of the whole file system, MB/s."""
    _check_throughput(throughput_per_tib)
    return fsx_tib(storage_gib) * throughput_per_tib


def burst_mbps(storage_gib: int, throughput_per_tib: int) -> float:
    """Disk burst throughput of the whole file system, MB/s (credit-limited; information only)."""
    _check_throughput(throughput_per_tib)
    return fsx_tib(storage_gib) * PERSISTENT_2_BURST_MBPS_PER_TIB[throughput_per_tib]


def smallest_valid_capacity_gib(needed_gib: float) -> int:
    """The smallest capacity FSx accepts that is at least `needed_gib`."""
    if needed_gib <= SMALLEST_CAPACITY_GIB:
        return SMALLEST_CAPACITY_GIB
    return math.ceil(needed_gib / CAPACITY_STEP_GIB) * CAPACITY_STEP_GIB


def _check_throughput(value: int) -> None:
    if value not in PERSISTENT_2_THROUGHPUTS:
        allowed = ", ".join(map(str, PERSISTENT_2_THROUGHPUTS))
        raise ValueError(f"PERSISTENT_2 throughput per TiB must be one of {allowed} (got {value})")
