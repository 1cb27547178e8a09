"""tools/cluster_smoke.py: the real `kubernetes` client against a local API endpoint (tests/tools/kube_api.py)
serving watch streams, pod logs and patches; helm through a fake runner (helm needs a real cluster).

Scenarios: a run that passes, runs whose summary shows a tier that did not recover, a pod whose init
container exits 2 (the Job fails at once), a Job whose pods never leave Pending (a clear error after the
start timeout), other training holding the GPUs (refused, or suspended and resumed).
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import kubernetes_validate
import numpy as np
import pytest
from kubernetes import client

from tests.chart.helm import env_of, render, trainer_container
from tests.tools.kube_api import FakeKubeApi
from tools import cluster_smoke as cs
from tools import smoke_plan
from tools.kube_watch import ContainerExit, container_exits, job_state

NS = "team-a"
RELEASE = "trainer-smoke"
JOB = "trainer-smoke-1a2b3c"  # the chart names the Job after its spec's digest: the tool looks it up
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


# -- objects, built with the client's models -------------------------------------------------------
def labels(release: str) -> dict[str, str]:
    return {
        "app.kubernetes.io/name": "trainer",
        "app.kubernetes.io/instance": release,
        "app.kubernetes.io/component": "trainer",
        "app.kubernetes.io/part-of": "nvrx-eks-blueprint",
    }


def job(name: str = JOB, release: str = RELEASE, condition: str | None = None) -> client.V1Job:
    conditions = [client.V1JobCondition(type=condition, status="True")] if condition else None
    return client.V1Job(
        api_version="batch/v1",
        kind="Job",
        metadata=client.V1ObjectMeta(name=name, labels=labels(release)),
        spec=client.V1JobSpec(template=client.V1PodTemplateSpec(), suspend=False),
        status=client.V1JobStatus(conditions=conditions),
    )


def terminated(name: str, code: int, reason: str) -> client.V1ContainerStatus:
    return client.V1ContainerStatus(
        name=name,
        image="trainer:f00d",
        image_id="",
        ready=False,
        restart_count=0,
        state=client.V1ContainerState(
            terminated=client.V1ContainerStateTerminated(exit_code=code, reason=reason)
        ),
    )


def pod(
    index: int,
    phase: str,
    init: Sequence[client.V1ContainerStatus] = (),
    main: Sequence[client.V1ContainerStatus] = (),
) -> client.V1Pod:
    return client.V1Pod(
        api_version="v1",
        kind="Pod",
        metadata=client.V1ObjectMeta(name=f"{JOB}-{index}-x{index}", labels=labels(RELEASE)),
        status=client.V1PodStatus(
            phase=phase, init_container_statuses=list(init) or None, container_statuses=list(main) or None
        ),
    )


def event(involved: str, reason: str, message: str) -> client.CoreV1Event:
    return client.CoreV1Event(
        metadata=client.V1ObjectMeta(name=f"{involved}.{reason.lower()}"),
        involved_object=client.V1ObjectReference(kind="Pod", name=involved, namespace=NS),
        reason=reason,
        message=message,
        type="Warning",
    )


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


# -- scenarios: what the cluster does once the release is installed ----------------------------------
def completes(api: FakeKubeApi, run_summary: dict[str, Any]) -> None:
    api.add("job", "ADDED", job())
    for i in (0, 1):
        api.add("pod", "ADDED", pod(i, "Pending"))
    api.add("event", "ADDED", event(f"{JOB}-0-x0", "Scheduled", "assigned to node gpu-1"), after_s=0.1)
    checked = [terminated("check-config", 0, "Completed")]
    for i in (0, 1):
        api.logs[(f"{JOB}-{i}-x{i}", "trainer")] = f"pod {i} step 0\npod {i} step 59\n"
        api.add("pod", "MODIFIED", pod(i, "Running", init=checked), after_s=0.3)
    for i in (0, 1):
        done = [terminated("trainer", 0, "Completed")]
        api.add("pod", "MODIFIED", pod(i, "Succeeded", init=checked, main=done), after_s=0.6)
    api.add("job", "MODIFIED", job(condition="Complete"), after_s=0.9)
    api.logs[(f"{cs.fullname(RELEASE)}-test-run", "summary")] = (
        "some log line\n" + smoke_plan.SUMMARY_MARKER + json.dumps(run_summary) + "\n"
    )


def config_error(api: FakeKubeApi) -> None:
    api.add("job", "ADDED", job())
    api.add("pod", "ADDED", pod(0, "Pending"))
    api.add("pod", "MODIFIED", pod(0, "Failed", init=[terminated("check-config", 2, "Error")]), after_s=0.3)
    api.add("job", "MODIFIED", job(condition="Failed"), after_s=0.5)


def never_starts(api: FakeKubeApi) -> None:
    api.add("job", "ADDED", job())
    for i in (0, 1):
        api.add("pod", "ADDED", pod(i, "Pending"))
    message = "0/3 nodes are available: 3 Insufficient nvidia.com/gpu."
    api.add("event", "ADDED", event(f"{JOB}-0-x0", "FailedScheduling", message), after_s=0.2)


class FakeHelm:
    """Answers helm like a cluster would; `install` lets the scenario populate the API."""

    def __init__(self, api: FakeKubeApi, on_install: Callable[[FakeKubeApi], None]) -> None:
        self.api, self.on_install = api, on_install
        self.calls: list[list[str]] = []
        self.installed_values: dict[str, Any] | None = None
        self.patches_at_install = -1

    def __call__(self, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        argv = list(argv)
        self.calls.append(argv)
        words, out = argv[1:], ""
        if words[:2] == ["get", "values"]:
            out = json.dumps(INFRA_VALUES)
        elif words[0] == "install":
            self.installed_values = json.loads(Path(argv[argv.index("-f") + 1]).read_text())
            self.patches_at_install = len(self.api.patches)
            self.on_install(self.api)
        elif words[0] == "test":
            out = "TEST SUITE: trainer-smoke-trainer-test-run\nPhase: Succeeded"
        return subprocess.CompletedProcess(argv, 0, out, "")

    def did(self, verb: str) -> bool:
        return any(c[1] == verb for c in self.calls)


def run_smoke(
    scenario: Callable[[FakeKubeApi], None], tmp_path: Path, *extra: str, busy: Sequence[str] = ()
) -> tuple[int, FakeHelm, FakeKubeApi]:
    with FakeKubeApi(NS) as api:
        for name in busy:
            api.add("job", "ADDED", job(name=name, release="trainer"))
        helm = FakeHelm(api, scenario)
        argv = ["--namespace", NS, "--helm", "helm", "--logs-dir", str(tmp_path / "logs"), *extra]
        rc = cs.main(argv, runner=helm, api_client=api.api_client())
    return rc, helm, api


# -- the flow ---------------------------------------------------------------------------------------
def test_passes_when_both_tiers_recovered(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, helm, api = run_smoke(lambda a: completes(a, summary()), tmp_path)
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "PASS: both tiers recovered" in out
    assert "tier 1, recovered" in out and "tier 2, recovered" in out
    # Pod phases and events came from the watch streams.
    assert f"pod {JOB}-0-x0: Pending" in out and f"pod {JOB}-1-x1: Succeeded" in out
    assert f"event: Warning Scheduled {JOB}-0-x0: assigned to node gpu-1" in out
    assert any(
        "watch=" not in r and r.startswith("GET /apis/batch/v1/namespaces/team-a/jobs") for r in api.requests
    )
    assert [" ".join(c[1:3]) for c in helm.calls] == [
        "get values",
        f"install {RELEASE}",
        f"test {RELEASE}",
        f"uninstall {RELEASE}",
    ]
    assert all(c[-2:] == ["-n", NS] for c in helm.calls)
    # The summary was read from the run-summary test pod's log through the API.
    assert f"GET /api/v1/namespaces/{NS}/pods/{cs.fullname(RELEASE)}-test-run/log" in api.requests


def test_streams_the_trainer_logs_to_files(tmp_path: Path) -> None:
    rc, _, _ = run_smoke(lambda a: completes(a, summary()), tmp_path)
    assert rc == 0
    deadline = time.monotonic() + 10  # the log threads may still be writing the last line
    log = tmp_path / "logs" / f"{JOB}-1-x1.log"
    while time.monotonic() < deadline and "step 59" not in (log.read_text() if log.exists() else ""):
        time.sleep(0.05)
    assert log.read_text() == "pod 1 step 0\npod 1 step 59\n"


@pytest.mark.parametrize(
    ("run_summary", "reason"),
    [
        (summary(tier1=False), "no recovered tier-1 fault"),
        (summary(tier2=False), "no recovered tier-2 fault"),
        (summary(final=45), "the run stopped at step 45"),
    ],
)
def test_fails_when_a_tier_did_not_recover(
    run_summary: dict[str, Any], reason: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, helm, _ = run_smoke(lambda a: completes(a, run_summary), tmp_path)
    assert rc == 1
    assert reason in capsys.readouterr().out
    assert not helm.did("uninstall")  # kept for inspection


def test_a_pod_that_exits_2_fails_the_run_with_its_container_and_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, helm, _ = run_smoke(config_error, tmp_path)
    out = capsys.readouterr().out
    assert rc == 1, out
    expected = f"pod {JOB}-0-x0: init container check-config exited 2 (Error): a usage or configuration error"
    assert f"FAIL: {expected}" in out
    assert "FAIL: the Job ended failed" in out
    assert not helm.did("test") and not helm.did("uninstall")


def test_a_job_that_never_starts_is_a_clear_error_after_its_timeout(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    started = time.monotonic()
    rc, helm, _ = run_smoke(never_starts, tmp_path, "--start-timeout", "1")
    elapsed = time.monotonic() - started
    err = capsys.readouterr().err
    assert rc == 2
    assert f"job {JOB}: no pod started within 1 s ({JOB}-0-x0 Pending, {JOB}-1-x1 Pending)" in err
    assert "FailedScheduling" in err and "Insufficient nvidia.com/gpu" in err
    assert 1 <= elapsed < 60
    assert not helm.did("test")


def test_refuses_while_other_training_holds_the_gpus(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, helm, api = run_smoke(lambda a: completes(a, summary()), tmp_path, busy=["trainer-9f9f9f"])
    assert rc == 2
    assert "--suspend-running" in capsys.readouterr().err
    assert not helm.did("install") and not api.patches


def test_suspends_and_resumes_other_training(tmp_path: Path) -> None:
    busy = "trainer-9f9f9f"
    rc, helm, api = run_smoke(lambda a: completes(a, summary()), tmp_path, "--suspend-running", busy=[busy])
    assert rc == 0
    assert api.patches == [(busy, {"spec": {"suspend": True}}), (busy, {"spec": {"suspend": False}})]
    assert helm.patches_at_install == 1  # suspended before the install, resumed after


def test_installed_values_render_a_valid_faulted_run(tmp_path: Path) -> None:
    """What the tool installs: Contract 1 kept, valid Kubernetes, flags the trainer accepts."""
    from trainer.config.train_config import config_from_args

    rc, helm, _ = run_smoke(lambda a: completes(a, summary()), tmp_path)
    assert rc == 0
    values = helm.installed_values
    assert values is not None
    for key in smoke_plan.CONTRACT_1_KEYS:
        assert values[key] == INFRA_VALUES[key]
    manifests = render(values, release=RELEASE)
    for manifest in manifests:
        kubernetes_validate.validate(manifest, "1.35.0", strict=True)
    container = trainer_container(manifests)
    env = env_of(container)
    args = [a.replace("$(DATA_PATH)", str(tmp_path / "t.npy")) for a in container["args"]]
    args = [a.replace("--device=cuda", "--device=cpu") for a in args]
    np.save(tmp_path / "t.npy", np.zeros(1024, dtype=np.uint16))
    cfg = config_from_args(args[args.index("trainer") + 1 :], env={})
    world = int(env["NNODES"]) * int(env["NPROC_PER_NODE"])
    kinds = {f.kind: f for f in cfg.faults.specs}
    assert set(kinds) == {"exception", "sigkill"}
    assert kinds["exception"].step < kinds["sigkill"].step < cfg.run.steps
    assert kinds["sigkill"].rank == world - 1
    assert env["OUT_DIR"].startswith("/fsx/runs/trainer-smoke-")  # a fresh run directory each time


# -- the pieces -------------------------------------------------------------------------------------
def test_render_only_needs_no_cluster(capsys: pytest.CaptureFixture[str]) -> None:
    assert cs.main(["--render-only", "--namespace", NS]) == 0
    out = capsys.readouterr().out
    assert "kind: Job" in out
    assert "--fault=exception:step=20:rank=1" in out


def test_job_state_and_exit_codes_from_the_models() -> None:
    assert job_state(job()) == "running"
    assert job_state(job(condition="Complete")) == "complete"
    assert job_state(job(condition="FailureTarget")) == "failed"
    not_yet = job()
    not_yet.status = client.V1JobStatus(conditions=[client.V1JobCondition(type="Failed", status="False")])
    assert job_state(not_yet) == "running"
    failed = pod(
        0,
        "Failed",
        init=[terminated("check-config", 0, "Completed")],
        main=[terminated("trainer", 1, "Error")],
    )
    assert container_exits(failed) == [
        ContainerExit(f"{JOB}-0-x0", "check-config", 0, "Completed", init=True),
        ContainerExit(f"{JOB}-0-x0", "trainer", 1, "Error", init=False),
    ]


def test_summary_parsing_and_verdict() -> None:
    assert smoke_plan.parse_summary('x\nRUN_SUMMARY {"steps": 3}\n') == {"steps": 3}
    with pytest.raises(smoke_plan.SmokeError):
        smoke_plan.parse_summary("no summary here")
    s = summary()
    s["faults"][1]["recovered"] = False
    verdict = smoke_plan.evaluate(s, smoke_plan.SmokePlan())
    assert not verdict.ok
    assert any("tier 2, NOT recovered" in line for line in verdict.lines)


def test_test_pod_names_match_the_chart() -> None:
    for release in ("trainer-smoke", "smoke", "a-long-release-name-for-a-training-run-of-team-alpha"):
        pods = [m["metadata"]["name"] for m in render({}, release=release) if m["kind"] == "Pod"]
        assert f"{cs.fullname(release)}-test-run" in pods


def test_plan_rejects_faults_that_cannot_both_fire() -> None:
    with pytest.raises(smoke_plan.SmokeError):
        smoke_plan.SmokePlan(steps=30, soft_fault_step=20, hard_fault_step=40)
    with pytest.raises(smoke_plan.SmokeError):
        smoke_plan.smoke_values({**INFRA_VALUES, "nodes": 1, "gpusPerNode": 1}, smoke_plan.SmokePlan(), "r")
