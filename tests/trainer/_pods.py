"""The values of the pods-level fault runs (bench/recovery_pods.py) that compare their final state with
the session's fault-free pods run (conftest `pods_clean_run`): a helper module, not a test module."""

from __future__ import annotations

from bench.recovery_pods import PodsConfig

PODS_CFG = PodsConfig(last_call_s=1)
"""rdzvLastCallTimeout 1 s, the chart's default: a survivor that stops its workers a moment after the spare
is ready still rejoins before the round closes (with 0, the demo's value, the spare can take its place and
the survivor's snapshots sit on a standby node: seen once, the ranks then restored nothing)."""
PODS_STEPS = 40
"""Steps of the run: 2 pods + 1 hot spare, 1 rank each, snapshots every step, replicated."""
