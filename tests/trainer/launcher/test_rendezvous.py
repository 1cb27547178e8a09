"""The job's rendezvous service (trainer/launcher/rendezvous.py) after a failed rendezvous: the pods the Job
controller re-creates join a fresh one and the run completes, and no pod's supervisor takes that fresh
rendezvous for a replaced service (which would restart ft_launcher in place, past the Job's limits)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import free_port
from tests.trainer._jobs import RUN_VALUES
from tools.localjob import LocalJob, PodSpec
from tools.podcommand import LocalPlaces, pod_argv
from trainer.launcher.rendezvous import EPOCH_KEY, FOLLOWS_FAILURE_KEY, shutdown_reason
from trainer.launcher.supervise import wait_for_other_epoch


def _store(port: int, **keys: str) -> Any:
    import torch.distributed as dist

    store = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False)
    for key, value in keys.items():
        store.set(key, value)
    return store


def test_the_fresh_rendezvous_after_a_failure_is_not_a_replaced_service() -> None:
    port = free_port()
    store = _store(port, **{EPOCH_KEY: "e2", FOLLOWS_FAILURE_KEY: "1"})
    assert wait_for_other_epoch(f"127.0.0.1:{port}", "e1", 1.0) is None
    store.delete_key(FOLLOWS_FAILURE_KEY)  # a service process started anew: replaced
    assert wait_for_other_epoch(f"127.0.0.1:{port}", "e1", 1.0) == "e2"


def test_the_shutdown_reason_is_read_where_nvrx_writes_it() -> None:
    from nvidia_resiliency_ext.fault_tolerance.ft_rendezvous_barrier import _RendezvousBarrierState

    port = free_port()
    store = _store(port)
    assert shutdown_reason(store, "job-a") is None
    state = _RendezvousBarrierState(store=store, run_id="job-a", is_store_host=True)
    state.set_shutdown("failure")
    assert shutdown_reason(store, "job-a") == "failure"
    assert shutdown_reason(store, "job-b") is None


@pytest.mark.slow
def test_a_pod_retried_after_its_launcher_ran_out_of_restarts_completes_the_run(
    token_file: Path, tmp_path: Path
) -> None:
    """No in-job restarts left (maxRestarts 0, no in-process tier): an exception fails the launcher, the
    pod exits 1 and the Job controller re-creates it (backoff limit 1). The new pod must train to the
    end from the shared checkpoint: with the closed rendezvous it failed at once, the retry wasted."""
    data = token_file
    port = free_port()
    out = tmp_path / "out"
    values = {
        **RUN_VALUES,
        "maxRestarts": 0,
        "inprocess": False,
        "faults": {"soft": "exception:step=4:rank=1"},
    }
    argv = pod_argv(values, LocalPlaces(port, data, out, tmp_path / "ckpt", tmp_path / "local"))
    stores = free_port(span=2)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TRAINER_PG_PORT": str(stores),
           "TRAINER_INPROCESS_PORT": str(stores + 1)}  # fmt: skip
    pod = PodSpec("pod", argv, env, tmp_path / "pod.log", fresh_dirs=(tmp_path / "local",))
    with LocalJob([pod], backoff_limit=1, host_port=port) as job:
        job.start()
        result = job.wait(timeout_s=300)
    log = (tmp_path / "pod.log").read_text()[-3000:]
    assert [e.returncode for e in result.exits] == [1, 0], (result, log)
    assert result.succeeded, (result, log)
    ends = [json.loads(x) for p in out.glob("events*.jsonl") for x in p.read_text().splitlines() if x]
    ends = [e for e in ends if e["ev"] == "run_end" and e["rank"] == 0]
    assert [e["status"] for e in ends] == ["failed", "completed"], ends
    assert ends[-1]["step"] == RUN_VALUES["steps"] - 1
    assert "serving a fresh one" in (tmp_path / "rendezvous.log").read_text()
