"""No pod and no single service is a point of failure (docs/failure-domains.md): the pod command
as the chart renders it, 2 nodes + 1 hot spare on 127.0.0.1 (bench/recovery_pods.py's harness), loses
node 0 (pod 0: the rendezvous host before the rendezvous service existed), then the rendezvous service
itself, then one training pod's ft_launcher process, and finishes in the job, bitwise equal to a
fault-free run of the same values:

* node 0's loss: the spare takes its place, the survivor keeps its group rank (sticky ranks) and
  restores from its own /dev/shm, the spare from the survivor's replica; at most one step recomputed;
  no pod but the lost one exits (the Job's failure budget is not charged for a peer);
* the service's loss (SIGKILL, replaced by LocalJob as its Deployment would be): each pod's supervisor
  starts ft_launcher again on the same pod; each pod claims its last group rank from the new service, so
  node 0's replacement (waiting in the rendezvous by then) stands by; the ranks restore from memory;
  no pod exits;
* one pod's ft_launcher SIGKILLed: that pod's main process ends its leftovers (workers, rank monitors)
  and starts ft_launcher again; one restart round, no pod exits.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench import recovery_pods
from tests.trainer.launcher.pods import PODS_CFG, final_state, pods_data

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def runs(
    tmp_path_factory: pytest.TempPathFactory, pods_clean_run: tuple[dict[str, Any], Path]
) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("no-spof")
    faulted = recovery_pods.SCENARIOS["compound/host-rendezvous-launcher"]
    rec = recovery_pods.run_once(faulted, PODS_CFG, work / "faulted", pods_data(tmp_path_factory))
    return {"faulted": (rec, work / "faulted"), "clean": pods_clean_run}


def _logs(run_dir: Path) -> str:
    return "\n".join(p.read_text(errors="replace") for p in sorted((run_dir / "logs").glob("*.log")))


def test_losing_node_0_is_recovered_in_the_job_from_memory_and_the_peer(runs: dict[str, Any]) -> None:
    rec, run_dir = runs["faulted"]
    assert rec["succeeded"] and rec["status"] == "completed", (rec["reason"], _logs(run_dir)[-6000:])
    (loss,) = rec["faults"]
    assert loss["type"] == "node-loss" and loss["ranks"] == [0]
    assert loss["steps_recomputed"] <= 1
    # The survivor (now still node 1, rank 1) restored its own snapshot; node 0's state came from the
    # replica its ring neighbour kept (never the durable checkpoint).
    assert loss["restored_by_source"] == {"shm": [1], "peer": [0]}, loss
    # Only the lost pod ended early: the survivors did not exit, so nothing but the disruption counts.
    # (Which pod held node 0 is the rendezvous' choice: the first two launchers to arrive train.)
    early = [e["index"] for e in rec["pod_exits"] if e["reason"] != "succeeded"]
    assert len(early) == 1, rec["pod_exits"]
    assert rec["takeover"] is not None and rec["takeover"] != f"pod-{early[0]}"
    assert rec["unplanned_pod_restarts"] == 0


def test_losing_the_rendezvous_service_costs_one_restart_round_and_no_pod(runs: dict[str, Any]) -> None:
    rec, run_dir = runs["faulted"]
    assert rec["action"] is not None and rec["action"]["action"] == "kill-rendezvous-then-launcher"
    logs = _logs(run_dir)
    # Every pod running at the time (the two training pods, the lost one's replacement if it had
    # started) started ft_launcher again once, on the same pod.
    for log in sorted((run_dir / "logs").glob("pod-*.log")):
        assert log.read_text(errors="replace").count("the rendezvous service was replaced") <= 1, log.name
    assert logs.count("the rendezvous service was replaced") >= 2, logs[-6000:]
    from trainer.events.metrics import read_events

    events, _ = read_events(run_dir / "out")
    killed_at = float(rec["action"]["rendezvous"]["t"])
    launcher_at = float(rec["action"]["launcher"]["t"])
    after = [e for e in events if e["ev"] == "restore" and killed_at < float(e["t"]) < launcher_at]
    # From memory, never a durable checkpoint (nor nothing: seen once before the pods' rank claims, node
    # 0's replacement took rank 0 from the new service and the run started over from step 0). The driver
    # kills the service once that replacement waits in the rendezvous.
    assert after and {e["source"] for e in after} <= {"shm", "peer"}, after
    assert len({e["rank"] for e in after}) == 2
    assert rec["unplanned_pod_restarts"] == 0


def test_losing_one_launcher_process_costs_one_restart_round_and_no_pod(runs: dict[str, Any]) -> None:
    rec, run_dir = runs["faulted"]
    killed = rec["action"]["launcher"]
    log = (run_dir / "logs" / f"pod-{killed['pod']}.log").read_text(errors="replace")
    assert log.count("ft_launcher was killed by signal 9 from outside") == 1, log[-4000:]
    from trainer.events.metrics import read_events

    events, _ = read_events(run_dir / "out")
    after = [e for e in events if e["ev"] == "restore" and float(e["t"]) > float(killed["t"])]
    # Every rank restored once more, from memory or a peer, never a durable checkpoint.
    assert after and {e["source"] for e in after} <= {"shm", "peer"}, after
    assert len({e["rank"] for e in after}) == 2
    assert rec["succeeded"] and rec["unplanned_pod_restarts"] == 0


def test_the_faulted_run_ends_bitwise_equal_to_a_fault_free_run(runs: dict[str, Any]) -> None:
    clean, clean_dir = runs["clean"]
    assert clean["succeeded"], clean["reason"]
    assert final_state(runs["faulted"][1] / "out") == final_state(clean_dir / "out")
