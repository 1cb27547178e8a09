"""What the launcher's end-to-end tests share: the pods harness's settings (bench/recovery_pods.py), its
token file, and the fault-free run they compare with (one per session: tests/trainer/conftest.py),
of the values of every faulted scenario it serves (2 nodes + 1 spare, one rank each, snapshots every
step, 40 steps)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench import recovery_pods
from bench.recovery_pods import PodsConfig, PodsScenario

# rdzvLastCallTimeout 1 s, the chart's default: a survivor that stops its workers a moment after the
# spare is ready still rejoins before the round closes (with 0, the demo's value, the spare can take its
# place and the survivor's snapshots sit on a standby node: seen once, the ranks then restored nothing).
PODS_CFG = PodsConfig(last_call_s=1)
CLEAN_SERVES = ("compound/host-rendezvous-launcher", "kills/each-process", "straggler/evict")
"""The scenarios compared with the fault-free run: their shape must be the same."""


def pods_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The token file of the session's pod runs (one per session, written once)."""
    return recovery_pods.make_data(tmp_path_factory.getbasetemp() / "pods-data" / "tokens.npy", PODS_CFG)


def clean_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    """(the record, the run directory) of the fault-free run."""
    shapes = {
        (s.nodes, s.spares, s.nproc, s.snapshots, s.steps, s.inprocess)
        for s in (recovery_pods.SCENARIOS[n] for n in CLEAN_SERVES)
    }
    assert len(shapes) == 1, f"the scenarios compared with one fault-free run differ in shape: {shapes}"
    nodes, spares, nproc, snapshots, steps, inprocess = shapes.pop()
    clean = PodsScenario(
        "clean", nodes, spares, nproc, (), inprocess=inprocess, snapshots=snapshots, steps=steps
    )
    run_dir = tmp_path_factory.mktemp("pods-clean")
    return recovery_pods.run_once(clean, PODS_CFG, run_dir, pods_data(tmp_path_factory)), run_dir


def final_state(out: Path) -> str:
    """The state digest of the first completed run_end in a pods run's event files."""
    for path in sorted(out.glob("events.rank*.jsonl")):
        for line in path.read_text().splitlines():
            event = json.loads(line)
            if event["ev"] == "run_end" and event.get("state_sha256"):
                return str(event["state_sha256"])
    raise AssertionError(f"no completed run_end with a state digest in {out}")
