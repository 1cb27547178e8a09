"""Any one process of a pod SIGKILLed from outside costs the job at most twice its worst single fault's
recovery + 10 s of wall time (docs/failure-domains.md): one shared run of the pods harness
(bench/recovery_pods.py `kills/each-process`: 2 nodes + 1 hot spare, the pod command as the chart renders
it) loses a rank to the trainer's own `sigkill` fault (the single fault whose MTTR sets the bound), then,
five steps apart, the zygote, the metrics exporter, a worker, ft_launcher, the rendezvous service and a
pod's main process (tools/podkill.py). Each test reads its kill from that run: what noticed it, what was
restarted, and the wall time it added against the session's fault-free run of the same values
(tests/trainer/launcher/conftest.py); the run ends bitwise equal to that one.

In `make soak`, not `make test`: the run takes 4-5 minutes on 2 cores, a third of the suite's budget.
`make test` keeps what each kill relies on: the zygote's death with its workers training on
(tests/trainer/launcher/test_prefork.py), its restart and ft_launcher's (test_supervise.py), the
exporter's restart (tests/trainer/events/), the rendezvous service's and ft_launcher's loss in the shared
run of test_no_single_point.py, and the main process's as the node loss every node-loss test makes.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from bench import recovery_pods
from tests.trainer.launcher.pods import PODS_CFG, final_state, pods_data
from tools import podkill
from trainer.events.metrics import read_events

pytestmark = [pytest.mark.slow, pytest.mark.soak]

SCENARIO = "kills/each-process"
WINDOW = 5
"""Steps after each kill over which its cost is measured: the scenario's distance between kills."""


@pytest.fixture(scope="module")
def run(
    tmp_path_factory: pytest.TempPathFactory, pods_clean_run: tuple[dict[str, Any], Path]
) -> dict[str, Any]:
    work = tmp_path_factory.mktemp("kills")
    # Six restarts' worth of new processes on 2 shared cores: more time than a single fault's run needs.
    cfg = dataclasses.replace(PODS_CFG, run_timeout_s=600.0)
    rec = recovery_pods.run_once(recovery_pods.SCENARIOS[SCENARIO], cfg, work, pods_data(tmp_path_factory))
    (work / "record.json").write_text(json.dumps(rec, indent=1, default=str))  # for reading a failed run
    clean, clean_dir = pods_clean_run
    events = read_events(work / "out")[0]
    logs = {p.stem: p.read_text(errors="replace") for p in sorted((work / "logs").glob("pod-*.log"))}
    return {
        "rec": rec,
        "dir": work,
        "clean": clean,
        "clean_dir": clean_dir,
        "events": events,
        "logs": logs,
        "kills": {k["process"]: k for k in rec["kills"]},
        "steps": podkill.step_times(events),
        "clean_steps": podkill.step_times(read_events(clean_dir / "out")[0]),
    }


def _killed(run: dict[str, Any], process: str) -> dict[str, Any]:
    """The kill of `process`, checked to have hit a process."""
    kill = run["kills"][process]
    assert kill["pids"] and not kill["missed"], kill
    return dict(kill)


@pytest.mark.parametrize("process", ["zygote", "exporter", "worker", "launcher", "rendezvous", "main"])
def test_each_kill_costs_at_most_twice_the_worst_single_fault_recovery_plus_10_s(
    run: dict[str, Any], process: str
) -> None:
    kill = _killed(run, process)
    extra = podkill.extra_wall_s(run["steps"], run["clean_steps"], kill["t"], WINDOW)
    worst = max(f["mttr_s"] for f in run["rec"]["faults"])
    assert extra is not None, f"the run never got {WINDOW} steps past the {process} kill"
    assert extra <= podkill.bound_s(worst), (process, extra, worst)


def _restores_between(run: dict[str, Any], start: float, end: float) -> list[dict[str, Any]]:
    return [e for e in run["events"] if e["ev"] == "restore" and start < float(e["t"]) < end]


def _next_kill_t(run: dict[str, Any], kill: dict[str, Any]) -> float:
    later = [float(k["t"]) for k in run["rec"]["kills"] if float(k["t"]) > float(kill["t"])]
    return min(later, default=float("inf"))


def _pod_log(run: dict[str, Any], kill: dict[str, Any]) -> str:
    return str(run["logs"][f"pod-{kill['pod']}"])


def test_the_run_completes_in_the_job_bitwise_equal_to_a_fault_free_run(run: dict[str, Any]) -> None:
    rec = run["rec"]
    assert rec["ok"] and rec["status"] == "completed", (rec["reason"], rec["kills"])
    assert sorted(k["process"] for k in rec["kills"]) == sorted(podkill.PROCESSES), "one of each kind"
    assert rec["unplanned_pod_restarts"] == 0, rec["pod_exits"]
    assert run["clean"]["succeeded"], run["clean"]["reason"]
    assert final_state(run["dir"] / "out") == final_state(run["clean_dir"] / "out")


def test_a_killed_zygote_costs_no_restart_round_and_is_replaced(run: dict[str, Any]) -> None:
    kill = _killed(run, "zygote")
    log = _pod_log(run, kill)
    assert "prefork: the zygote died; the worker runs on" in log
    assert "the zygote ended (signal 9); its workers train on; starting a fresh zygote (restart 1)" in log
    # The workers trained on: nothing restored until the next kill.
    assert not _restores_between(run, kill["t"], _next_kill_t(run, kill))


def test_a_killed_exporter_is_started_again_and_training_never_waits(run: dict[str, Any]) -> None:
    kill = _killed(run, "exporter")
    assert "metrics endpoint process ended (-9); starting it again" in _pod_log(run, kill)
    assert not _restores_between(run, kill["t"], _next_kill_t(run, kill))


def test_a_killed_worker_costs_one_restart_round_from_memory(run: dict[str, Any]) -> None:
    kill = _killed(run, "worker")
    after = _restores_between(run, kill["t"], _next_kill_t(run, kill))
    assert after and {e["source"] for e in after} <= {"shm", "peer"}, after


def test_a_killed_ft_launcher_is_started_again_on_its_pod(run: dict[str, Any]) -> None:
    kill = _killed(run, "launcher")
    assert _pod_log(run, kill).count("ft_launcher was killed by signal 9 from outside") == 1
    assert "the standby ft_launcher was gone" not in _pod_log(run, kill), "started warm, from its standby"
    after = _restores_between(run, kill["t"], _next_kill_t(run, kill))
    assert after and {e["source"] for e in after} <= {"shm", "peer"}, after


def test_a_killed_rendezvous_service_costs_one_round_and_no_pod(run: dict[str, Any]) -> None:
    kill = _killed(run, "rendezvous")
    assert sum(log.count("the rendezvous service was replaced") for log in run["logs"].values()) >= 2
    service_log = (run["dir"] / "logs" / "rendezvous.log").read_text(errors="replace")
    assert "its standby takes the port (hand-over 1)" in service_log, "the service's standby took over"
    assert not any("the standby ft_launcher was gone" in log for log in run["logs"].values())
    after = _restores_between(run, kill["t"], _next_kill_t(run, kill))
    assert after and {e["source"] for e in after} <= {"shm", "peer"}, after


def test_a_killed_main_process_is_a_lost_pod_and_the_spare_takes_its_place(run: dict[str, Any]) -> None:
    kill = _killed(run, "main")
    early = [e for e in run["rec"]["pod_exits"] if e["reason"] != "succeeded"]
    assert [(e["index"], e["returncode"]) for e in early] == [(kill["pod"], -9)], early
    after = _restores_between(run, kill["t"], float("inf"))
    assert after and {e["source"] for e in after} <= {"shm", "peer"}, after
