"""tools/cluster_smoke.py up to the cluster: values, manifests, command flow against a fake helm/kubectl.

No Kubernetes API server can run on this machine, so the commands go to a fake that answers like helm
and kubectl would; what reaches the (fake) cluster is checked by rendering it with the real chart.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import kubernetes_validate
import numpy as np
import pytest

from tests.chart.helm import env_of, render, trainer_container
from tools import cluster_smoke as cs

INFRA_VALUES = {
    "image": {
        "repository": "111.dkr.ecr.us-west-2.amazonaws.com/cdk-hnb659fds-container-assets",
        "tag": "f00d",
    },
    "nodes": 2,
    "instanceType": "p5.48xlarge",
    "gpusPerNode": 8,
    "efaPerNode": 32,
    "storage": {"claimName": "fsx-shared", "localNvmePath": "/mnt/nvme"},
    "serviceAccountName": "trainer",
}


def summary(
    tier1: bool = True, tier2: bool = True, status: str = "completed", final: int = 59
) -> dict[str, Any]:
    faults = []
    if tier1:
        faults.append(
            {"type": "exception", "step": 20, "rank": 1, "tier": 1, "recovered": True, "mttr_s": 2.5}
        )
    if tier2:
        faults.append(
            {"type": "sigkill", "step": 40, "rank": 15, "tier": 2, "recovered": True, "mttr_s": 21.0}
        )
    return {
        "status": status,
        "steps": final + 1,
        "final_step": final,
        "training_efficiency": 0.9,
        "productive_s": 90.0,
        "wall_s": 100.0,
        "faults": faults,
    }


class FakeCluster:
    """Answers helm and kubectl commands like a cluster where the smoke Job runs and finishes."""

    def __init__(self, run_summary: dict[str, Any], busy_jobs: Sequence[str] = (), job_end: str = "Complete"):
        self.calls: list[list[str]] = []
        self.installed_values: dict[str, Any] | None = None
        self.run_summary = run_summary
        self.busy_jobs = list(busy_jobs)
        self.job_end = job_end
        self.job_polls = 0

    def __call__(self, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        argv = list(argv)
        self.calls.append(argv)
        tool, words = Path(argv[0]).name, argv[1:]
        out, rc = "", 0
        if tool == "helm" and words[:2] == ["get", "values"]:
            out = json.dumps(INFRA_VALUES)
        elif tool == "helm" and words[0] == "install":
            values_file = argv[argv.index("-f") + 1]
            self.installed_values = json.loads(Path(values_file).read_text())
        elif tool == "kubectl" and "jobs" in words:
            items = [{"metadata": {"name": n}, "spec": {}, "status": {}} for n in self.busy_jobs]
            out = json.dumps({"items": items})
        elif tool == "kubectl" and "job" in words and "get" in words:
            self.job_polls += 1
            done = self.job_polls >= 3
            conditions = [{"type": self.job_end, "status": "True"}] if done else []
            out = json.dumps({"status": {"conditions": conditions}})
        elif tool == "kubectl" and "pods" in words:
            phase = "Succeeded" if self.job_polls >= 3 else "Running"
            out = json.dumps({"items": [{"status": {"phase": phase}}] * 2})
        elif tool == "kubectl" and "logs" in words:
            out = "some log line\n" + cs.SUMMARY_MARKER + json.dumps(self.run_summary) + "\n"
        elif tool == "helm" and words[0] == "test":
            out = "TEST SUITE: trainer-smoke-test-run\nPhase: Succeeded"
        return subprocess.CompletedProcess(argv, rc, out, "")


def run_main(fake: FakeCluster, *extra: str) -> int:
    argv = ["--namespace", "team-a", "--poll", "0", "--helm", "helm", "--kubectl", "kubectl", *extra]
    return cs.main(argv, runner=fake)


def test_passes_when_both_tiers_recovered(capsys: pytest.CaptureFixture[str]) -> None:
    fake = FakeCluster(summary())
    assert run_main(fake) == 0
    out = capsys.readouterr().out
    assert "PASS: both tiers recovered" in out
    assert "tier 1, recovered" in out and "tier 2, recovered" in out
    commands = [" ".join(c[:3]) for c in fake.calls]
    assert commands[0] == "helm get values"
    assert any(c.startswith("helm install trainer-smoke") for c in commands)
    assert commands[-1].startswith("helm uninstall trainer-smoke")
    # The summary is read from the run-summary test pod of this release.
    logs = next(c for c in fake.calls if "logs" in c)
    assert "trainer-smoke-test-run" in logs and all("-n" in c for c in fake.calls)


@pytest.mark.parametrize(
    ("run_summary", "job_end", "reason"),
    [
        (summary(tier1=False), "Complete", "no recovered tier-1 fault"),
        (summary(tier2=False), "Complete", "no recovered tier-2 fault"),
        (summary(status="failed", final=30), "Failed", "the run did not complete"),
        (summary(final=45), "Complete", "the run stopped at step 45"),
    ],
)
def test_fails_when_a_tier_did_not_recover(
    run_summary: dict[str, Any], job_end: str, reason: str, capsys: pytest.CaptureFixture[str]
) -> None:
    fake = FakeCluster(run_summary, job_end=job_end)
    assert run_main(fake) == 1
    assert reason in capsys.readouterr().out
    assert not any("uninstall" in c for c in fake.calls)  # kept for inspection


def test_unrecovered_fault_fails() -> None:
    s = summary()
    s["faults"][1]["recovered"] = False
    verdict = cs.evaluate(s, cs.SmokePlan())
    assert not verdict.ok
    assert any("tier 2, NOT recovered" in line for line in verdict.lines)


def test_refuses_while_other_training_holds_the_gpus(capsys: pytest.CaptureFixture[str]) -> None:
    fake = FakeCluster(summary(), busy_jobs=["trainer"])
    assert run_main(fake) == 2
    assert "--suspend-running" in capsys.readouterr().err
    assert not any(c[1] == "install" for c in fake.calls if c[0] == "helm")


def test_suspends_and_resumes_other_training() -> None:
    fake = FakeCluster(summary(), busy_jobs=["trainer"])
    assert run_main(fake, "--suspend-running") == 0
    patches = [c for c in fake.calls if "patch" in c]
    assert [json.loads(c[-1])["spec"]["suspend"] for c in patches] == [True, False]
    assert fake.calls.index(patches[0]) < next(i for i, c in enumerate(fake.calls) if "install" in c)


def test_installed_values_render_a_valid_faulted_run(tmp_path: Path) -> None:
    """What the tool installs: Contract 1 kept, valid Kubernetes, flags the trainer accepts."""
    from trainer.config import config_from_args

    fake = FakeCluster(summary())
    assert run_main(fake) == 0
    values = fake.installed_values
    assert values is not None
    for key in cs.CONTRACT_1_KEYS:
        assert values[key] == INFRA_VALUES[key]
    manifests = render(values, release="trainer-smoke")
    for manifest in manifests:
        kubernetes_validate.validate(manifest, "1.35.0", strict=True)
    container = trainer_container(manifests)
    env = env_of(container)
    args = [a.replace("$(DATA_PATH)", str(tmp_path / "t.npy")) for a in container["args"]]
    args = [a.replace("--device=cuda", "--device=cpu") for a in args]
    np.save(tmp_path / "t.npy", np.zeros(1024, dtype=np.uint16))
    cfg = config_from_args(args[args.index("trainer") + 1 :], env={})
    world = int(env["NNODES"]) * int(env["NPROC_PER_NODE"])
    kinds = {f.kind: f for f in cfg.faults}
    assert set(kinds) == {"exception", "sigkill"}
    assert kinds["exception"].step < kinds["sigkill"].step < cfg.steps
    assert kinds["sigkill"].rank == world - 1
    assert env["OUT_DIR"].startswith("/fsx/runs/trainer-smoke-")  # a fresh run directory each time


def test_render_only_needs_no_cluster(capsys: pytest.CaptureFixture[str]) -> None:
    assert cs.main(["--render-only", "--namespace", "team-a"]) == 0
    out = capsys.readouterr().out
    assert "kind: Job" in out
    assert "--fault=exception:step=20:rank=1" in out


def test_job_state_and_summary_parsing() -> None:
    assert cs.job_state({"status": {}}) == "running"
    assert cs.job_state({"status": {"conditions": [{"type": "Complete", "status": "True"}]}}) == "complete"
    assert cs.job_state({"status": {"conditions": [{"type": "FailureTarget", "status": "True"}]}}) == "failed"
    assert cs.job_state({"status": {"conditions": [{"type": "Failed", "status": "False"}]}}) == "running"
    assert cs.parse_summary('x\nRUN_SUMMARY {"steps": 3}\n') == {"steps": 3}
    with pytest.raises(cs.SmokeError):
        cs.parse_summary("no summary here")


def test_fullname_matches_the_chart() -> None:
    for release in ("trainer-smoke", "smoke", "a-long-release-name-for-a-training-run-of-team-alpha"):
        manifests = render({}, release=release)
        job = next(m for m in manifests if m["kind"] == "Job")
        assert cs.fullname(release) == job["metadata"]["name"]


def test_plan_rejects_faults_that_cannot_both_fire() -> None:
    with pytest.raises(cs.SmokeError):
        cs.SmokePlan(steps=30, soft_fault_step=20, hard_fault_step=40)
    with pytest.raises(cs.SmokeError):
        cs.smoke_values({**INFRA_VALUES, "nodes": 1, "gpusPerNode": 1}, cs.SmokePlan(), "r")
