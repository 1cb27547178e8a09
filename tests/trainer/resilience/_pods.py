"""The pod command of Contract 2 run as LocalJob pods on 127.0.0.1, and what such a run wrote (a helper
module shared by test_tier2.py and test_node_loss.py, not a test module).

Timeouts are seconds, nested as trainer/resilience/timeouts.py requires; the initial heartbeat timeout
covers imports on a busy machine. Six launcher restarts: a spurious timeout under heavy load costs one
restart, not the test. The chart's checkpoint mode, nvrx, commits a save at a later step than it starts
it: a fault at step 9 comes right after the save of step 8 started, when steps 2 and 5 are surely
committed and 8 surely not.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench import podrun
from tests.helpers import REPO_ROOT, free_port
from tools.localpods import LocalJob, node_places, node_pod_spec
from tools.podcommand import LocalPlaces, pod_argv, with_options

STEPS = 12
CKPT_INTERVAL = 3
TIMEOUTS = {
    # 6 s, not less: on a loaded 2-core machine the first step after a restart (FSDP's first gathers while
    # the peer still builds its model) took over 4 s and a 4 s collective timeout restarted healthy runs.
    "collective": 6.0,
    "soft": 7.0,
    "hard": 8.0,
    "barrier": 9.0,
    # Above the first nvrx save (its worker's cold start sends no heartbeat): at 10 s a loaded machine
    # had the launcher kill healthy workers 4 times in a row before the test's own fault.
    "heartbeat": 30.0,
    "initial_heartbeat": 90.0,
    "check_interval": 0.5,
}
JOB_TIMEOUT_S = 240.0


def pod_values(nnodes: int, nproc: int, **overrides: Any) -> dict[str, Any]:
    """The chart values (k8s/values.yaml names) of these runs: TIMEOUTS, STEPS, then `overrides`."""
    t = TIMEOUTS
    values: dict[str, Any] = {
        "nodes": nnodes,
        "gpusPerNode": nproc,
        "maxRestarts": 6,
        "monitorInterval": 0.5,
        "ftRankHeartbeatTimeout": t["heartbeat"],
        "ftInitialRankHeartbeatTimeout": t["initial_heartbeat"],
        "ftWorkloadCheckInterval": t["check_interval"],
        "workersStopTimeout": 5,
        "terminationGracePeriodSeconds": 15,  # --term-timeout=5
        "rdzvJoinTimeout": 600,  # torch's own default
        "preset": "tiny",
        "seqLen": 32,
        "microBatchSize": 2,
        "steps": STEPS,
        "seed": 1234,  # the trainer's default
        "ckptInterval": CKPT_INTERVAL,
        "ckptKeep": 2,
        "ckptMode": "nvrx",  # the chart default
        "collectiveTimeout": t["collective"],
        "inprocessSoftTimeout": t["soft"],
        "inprocessHardTimeout": t["hard"],
        "inprocessBarrierTimeout": t["barrier"],
        "inprocessLivenessTimeout": min(10, t["hard"]),  # must not exceed the hard timeout
        "snapshotInterval": 0,  # these tests assert recovery from the durable checkpoint
    }
    return {**values, **overrides}


def job(
    tmp_path: Path,
    data: Path,
    *,
    nnodes: int,
    nproc: int,
    extra: list[str],
    values: dict[str, Any] | None = None,
    **kw: Any,
) -> LocalJob:
    """`nnodes` LocalJob pods of `nproc` ranks running the pod command as the chart renders it
    (tools/podcommand.py) with pod_values(nnodes, nproc, **values), `extra` last among the trainer's
    options; output in tmp_path/run,
    logs in tmp_path/pod-<i>.log."""
    port = free_port()
    out = tmp_path / "run"
    env = podrun.pod_env(REPO_ROOT)  # the trainer's stores outside the ephemeral range (EADDRINUSE seen)
    chart_values = pod_values(nnodes, nproc, **(values or {}))
    specs = []
    for i in range(nnodes):  # each pod on a node of its own: its own NVMe and /dev/shm folders
        places = node_places(LocalPlaces(port, data, out), i)
        argv = with_options(pod_argv(chart_values, places), extra)
        # GROUP_RANK: the infrastructure rank NVRx orders a round's nodes by, so pod i starts as node i
        # (the rendezvous service ranks the launchers; none of them is pod 0 by hosting the store).
        env_i = {**env, "GROUP_RANK": str(i)}
        specs.append(node_pod_spec(f"pod-{i}", argv, env_i, tmp_path / f"pod-{i}.log", places))
    return LocalJob(specs, host_port=port, **kw)


def events(out: Path) -> list[dict[str, Any]]:
    """Every rank's events, sorted by time."""
    evs = []
    for path in sorted(out.glob("events.rank*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                evs.append(json.loads(line))
    return sorted(evs, key=lambda e: float(e["t"]))


def logs(tmp_path: Path, tail: int = 3000) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text()[-tail:]}" for p in sorted(tmp_path.glob("pod-*.log")))


def assert_completed_once_more(
    out: Path, tmp_path: Path, restarted_ranks: set[int], steps: int = STEPS
) -> dict[str, Any]:
    """The run finished every step; the given ranks ran in a new process that resumed from a checkpoint."""
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed", logs(tmp_path)
    assert summary["final_step"] == steps - 1 and summary["steps"] == steps
    evs = events(out)
    starts = [e for e in evs if e["ev"] == "run_start"]
    for rank in restarted_ranks:
        pids = {e["pid"] for e in starts if e["rank"] == rank}
        assert len(pids) >= 2, f"rank {rank} was not restarted in a new process: {pids}"
    # The restart resumed from a committed checkpoint, not from scratch.
    resumed = [e for e in evs if e["ev"] == "restore" and e["rank"] == 0 and int(e["step"]) >= 0]
    assert resumed, "no restore from a checkpoint after the fault"
    commits = {int(e["step"]) for e in evs if e["ev"] == "ckpt_commit"}
    assert int(resumed[0]["step"]) in commits
    # Every step number was completed by rank 0, the last one in the final incarnation.
    done = {int(e["step"]) for e in evs if e["ev"] == "step"}
    assert done == set(range(steps))
    ends = [e for e in evs if e["ev"] == "run_end" and e["status"] == "completed"]
    assert {e["rank"] for e in ends} == {0, 1}
    return summary
