"""A model this project does not define, trained through trainer.api under faults of every tier, ends
bitwise equal to a fault-free run.

GPT-2 from Hugging Face transformers (built from its config, no weights downloaded), with dropout, an LR
scheduler and `api.SampleCursor` over a map-style dataset: examples/gpt2/train.py, run as the chart runs
a team's code (values `entrypoint` and `entrypointArgs`), as local pods: 2 nodes x 1 rank and a hot spare,
snapshots every step replicated to the other node (the chart's defaults), nvrx checkpoints. One faulted
run takes an exception (tier 1: the Wrapper restarts the attempt in the same process, restored from
memory), a SIGKILL (tier 2: ft_launcher restarts the workers, restored from /dev/shm) and the loss of
node 1 whole (the spare takes its place and restores the lost node's rank from the survivor's replica).
The digest at the end covers the model, the optimizer, the scheduler, the data position and every
rank's RNG streams (trainer/digest/state_hash.py): dropout masks drawn after a restore must be the same ones.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import REPO_ROOT, free_port
from tools.localjob import LocalJob
from tools.localpods import node_places, node_pod_spec
from tools.podcommand import LocalPlaces, pod_argv
from trainer.config.components import chart_values
from trainer.events.metrics import read_events

STEPS = 18
# The node loss comes before the SIGKILL: in the first round node 1 is surely pod 1 (after a restart
# round the hot spare may hold any place). The SIGKILL comes once the lost pod's replacement stands by.
FAULTS = {
    "soft": "exception:step=3:rank=1",
    "node": "node-loss:step=6:node=1",
    "hard": "sigkill:step=14:rank=0",
}
TEAM_ARGS = ["--layers", "2", "--width", "32", "--seq-len", "16", "--batch-size", "2", "--dropout", "0.1"]
RUN_TIMEOUT_S = 300.0


def _values(faults: dict[str, str], spares: int) -> dict[str, Any]:
    trainer = chart_values(
        {
            "run.entrypoint": "examples.gpt2.train:train",
            "run.steps": STEPS,
            "run.seed": 3,
            "ckpt.interval_steps": 5,
            "ckpt.keep_latest": 2,
            "ckpt.mode": "nvrx",
            "snapshot.interval_steps": 1,
            "snapshot.replication": True,
            "timeouts.collective_timeout": 10,
            "timeouts.inprocess_soft_timeout": 15,
            "timeouts.inprocess_hard_timeout": 20,
            "timeouts.inprocess_barrier_timeout": 25,
            "timeouts.heartbeat_timeout": 30,
            "timeouts.inprocess_liveness_timeout": 3.0,
            "faults.specs": faults,
        }
    )
    return {
        **trainer,
        "entrypointArgs": TEAM_ARGS,
        "nodes": 2,
        "spareNodes": spares,
        "gpusPerNode": 1,
        "ftInitialRankHeartbeatTimeout": 60,
        "ftWorkloadCheckInterval": 1,
        "monitorInterval": 0.5,
        "maxRestarts": 6,
        "workersStopTimeout": 5,
        "terminationGracePeriodSeconds": 15,
        "rdzvJoinTimeout": 120,
        "rdzvLastCallTimeout": 0,
    }


def _run(run_dir: Path, data: Path, faults: dict[str, str], spares: int) -> list[dict[str, Any]]:
    """Run the job as local pods until it completes; its events."""
    port, stores = free_port(), free_port(span=2)
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO_ROOT),  # the team's code (examples/) is on the image's path
        "OMP_NUM_THREADS": "1",
        "TRAINER_PG_PORT": str(stores),
        "TRAINER_INPROCESS_PORT": str(stores + 1),
    }
    values = _values(faults, spares)
    specs = []
    for index in range(2 + spares):
        places = node_places(LocalPlaces(port, data, run_dir / "out", run_dir / "ckpt"), index)
        pod_env = {**env, "GROUP_RANK": str(index), "JOB_COMPLETION_INDEX": str(index)}
        log = run_dir / "logs" / f"pod-{index}.log"
        specs.append(node_pod_spec(f"pod-{index}", pod_argv(values, places), pod_env, log, places))
    with LocalJob(
        specs, backoff_limit=len(specs) + 2, fail_job_exit_codes=(2, 93), replace_delay_s=10.0, host_port=port
    ) as job:
        job.start()
        t0 = time.monotonic()
        result = None
        while result is None and time.monotonic() - t0 < RUN_TIMEOUT_S:
            result = job.poll()
            time.sleep(0.2)
        if result is None:
            result = job.wait(timeout_s=0.1)
    logs = "\n".join(p.read_text(errors="replace")[-3000:] for p in sorted((run_dir / "logs").glob("*.log")))
    assert result.succeeded, f"{result}\n{logs}"
    return read_events(run_dir / "out")[0]


def _of(evs: list[dict[str, Any]], ev: str, **match: Any) -> list[dict[str, Any]]:
    return [e for e in evs if e["ev"] == ev and all(e.get(k) == v for k, v in match.items())]


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # The pods' DATA_PATH env entry (a local place): this entry point gets no --data-path and reads none
    # (its data is its own dataset).
    path = tmp_path_factory.mktemp("data") / "unused.bin"
    path.write_bytes(b"team data lives elsewhere")
    return path


@pytest.mark.slow
def test_gpt2_under_faults_of_every_tier_ends_bitwise_equal_to_a_fault_free_run(
    tmp_path: Path, data: Path
) -> None:
    clean = _run(tmp_path / "clean", data, {}, spares=0)
    (clean_end,) = _of(clean, "run_end", rank=0, status="completed")
    faulty = _run(tmp_path / "faulty", data, FAULTS, spares=1)

    injected = sorted((e["fault"], e["step"]) for e in _of(faulty, "fault_injected"))
    assert injected == [("exception", 3), ("node-loss", 6), ("sigkill", 14)], injected
    # Tier 1: the same process restarted the attempt, restored from its own memory.
    assert _of(faulty, "fault_detected", rank=1, tier=1), "no in-process restart"
    assert any(r["source"] == "memory" for r in _of(faulty, "restore", rank=1, iteration=1))
    # Tier 2 and the node loss: new processes restored from /dev/shm and from the peer's replica.
    sources = {r["source"] for r in _of(faulty, "restore") if r["step"] >= 0}
    assert {"memory", "shm", "peer"} <= sources, sources
    # Every recovery went back at most one step (snapshots every step).
    steps = [e["step"] for e in _of(faulty, "step")]
    assert sorted(set(steps)) == list(range(STEPS)), steps
    assert len(steps) - STEPS <= 3, f"{len(steps) - STEPS} steps recomputed for 3 faults"
    # The team's arguments reached the function untouched, and it trained.
    assert all(e["config"]["run"]["entry_args"] == TEAM_ARGS for e in _of(faulty, "run_start"))
    losses = [e["loss"] for e in _of(clean, "step")]
    assert losses[-1] < losses[0], losses
    (end,) = _of(faulty, "run_end", rank=0, status="completed")
    differ = {k: (v, clean_end["state_parts"][k]) for k, v in end["state_parts"].items()
              if v != clean_end["state_parts"][k]}  # fmt: skip
    assert end["state_sha256"] == clean_end["state_sha256"], f"these parts differ: {differ}"
    assert all(e["loss"] == e["loss"] for e in _of(faulty, "step")), "a step logged no loss"
