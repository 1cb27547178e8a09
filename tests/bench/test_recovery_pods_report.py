"""bench.recovery_pods without training: the pods' commands, the figures of a run, the report's table."""

from __future__ import annotations

from pathlib import Path

from bench.recovery_pods import SCENARIOS, PodsConfig, aggregate, measure, pod_specs
from bench.report.pods import pods_section
from tools.localjob import JobResult, PodExit


def test_every_pod_runs_the_chart_command_with_its_own_node_local_places(tmp_path: Path) -> None:
    sc = SCENARIOS["node-loss/spare"]
    specs = pod_specs(sc, PodsConfig(), tmp_path, tmp_path / "tokens.npy", 12345)
    assert [s.env["GROUP_RANK"] for s in specs] == ["0", "1", "2"]  # 2 nodes + 1 spare
    argv = specs[0].argv
    assert "--nnodes=2:3" in argv and "--rdzv-conf=join_timeout=120,last_call_timeout=0" in argv
    assert "--fault=node-loss:step=6:node=1" in argv
    local = [next(a for a in s.argv if a.startswith("--ckpt-local-dir=")) for s in specs]
    assert len(set(local)) == 3
    assert len({s.env["TRAINER_PG_PORT"] for s in specs}) == 1  # every rank finds the same store


def _exit(index: int, reason: str, t: float, rc: int = 0) -> PodExit:
    return PodExit(index, 0, rc, reason, t)


def test_a_pod_nobody_killed_that_was_replaced_fails_the_run(tmp_path: Path) -> None:
    sc = SCENARIOS["compound/rank-during-restart"]
    (tmp_path / "logs").mkdir()
    result = JobResult(False, "backoff", (_exit(0, "failed", 10.0, 1),))
    rec = measure(sc, tmp_path, result, {"action": sc.action}, 5.0)
    assert rec["unplanned_pod_restarts"] == 1 and not rec["ok"]


def test_the_report_puts_compound_faults_beside_the_one_pod_figures() -> None:
    runs = [
        {"scenario": "compound/spare-during-join", "ok": True, "mttr_s": m, "single_mttr_s": s,
         "compound_over_single": m / s, "linger_s": 1.0, "worker_group_restarts": 3, "takeover": "pod-2"}
        for m, s in ((12.0, 8.0), (14.0, 7.0), (13.0, 9.0))
    ]  # fmt: skip
    res = {"config": PodsConfig().__dict__, "reps": 3, "runs": runs, "summary": aggregate(runs)}
    one_pod = {"summary": {"sigkill/tier2": {"mttr_s": {"median": 3.0, "min": 2.6, "max": 3.3, "n": 3}}}}
    text = pods_section(res, one_pod)
    row = next(line for line in text.splitlines() if "compound/spare-during-join" in line)
    assert "13.00 s (12.00-14.00)" in row and "8.00 s (7.00-9.00)" in row and "pod-2" in row
    assert "3.00 s (2.60-3.30) (`sigkill/tier2`)" in row
