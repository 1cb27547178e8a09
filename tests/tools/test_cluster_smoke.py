"""tools/cluster_smoke.py against the real API server (the session's control plane, tests/conftest.py),
its pods run by the process kubelet (tools/kubelet): the real `kubernetes` client's watches, the events
the real scheduler writes, pod logs through the API server's `pods/log`, Job suspension through the real
Job controller. helm is played by a runner that, where helm would install the smoke release (which runs a
real training), creates a Job of the release's name and labels whose pods play the scenario in a few
seconds (an init container `check-config`, a `trainer` container printing its steps), and for
`helm test` the run-summary pod printing the scenario's summary. The full release, installed by the real
helm and run by the real trainer, is `make demo-cluster`'s (tools/demo_cluster.py).

Scenarios: a run that passes, runs whose summary shows a tier that did not recover, a pod whose init
container exits 2 (the Job fails at once through its podFailurePolicy), a Job whose pods never leave
Pending (FailedScheduling from the real scheduler, a clear error after the start timeout), other training
holding the GPUs (refused, or suspended and resumed).
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import kubernetes_validate
import numpy as np
import pytest
from kubernetes import client

from tests.chart.helm import env_of, render, trainer_container
from tests.clusterkit import Cluster, kubelet_cluster, wait_for
from tools import cluster_smoke as cs
from tools import smoke_plan
from tools.controlplane.launch import ControlPlane
from tools.kube_watch import ContainerExit, container_exits, job_state

NS = "team-a"  # the pieces below, which need no cluster
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
GPU_POD = {
    "nodeSelector": {"node.kubernetes.io/instance-type": "p5.48xlarge", "blueprint.nvrx/node-role": "gpu"},
    "tolerations": [{"key": "nvidia.com/gpu", "operator": "Equal", "value": "true", "effect": "NoSchedule"}],
}


@pytest.fixture(scope="module")
def kube_cluster(control_plane: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with kubelet_cluster(control_plane, tmp_path_factory.mktemp("nodes")) as cl:
        yield cl


@pytest.fixture
def cluster(kube_cluster: Cluster) -> Iterator[Cluster]:
    """A namespace of the test's own (the smoke run's objects have fixed names)."""
    namespace = f"team-{uuid.uuid4().hex[:6]}"
    kube_cluster.new_namespace(namespace)
    cl = Cluster(kube_cluster.plane, kube_cluster.kubelet, namespace)
    yield cl
    cl.core.delete_namespace(namespace)


# -- objects, built with the client's models (for the pieces) -----------------------------------------
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


# -- scenarios: the Job the release would create, as real objects ----------------------------------
def trainer_job(
    name: str, release: str, *, check_exit: int = 0, gpus: int = 8, pods: int = 2, trainer: str = ""
) -> dict[str, Any]:
    """An Indexed Job with the chart's labels, GPU placement and FailJob rule, its pods playing a run."""
    script = trainer or 'echo "pod $JOB_COMPLETION_INDEX step 0"; echo "pod $JOB_COMPLETION_INDEX step 59"'
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "labels": labels(release)},
        "spec": {
            "completionMode": "Indexed",
            "completions": pods,
            "parallelism": pods,
            "backoffLimit": 0,
            "podReplacementPolicy": "Failed",
            "podFailurePolicy": {
                "rules": [{"action": "FailJob", "onExitCodes": {"operator": "In", "values": [2, 93]}}]
            },
            "template": {
                "metadata": {"labels": labels(release)},
                "spec": {
                    "restartPolicy": "Never",
                    "terminationGracePeriodSeconds": 2,
                    **GPU_POD,
                    "initContainers": [
                        {"name": "check-config", "image": "t", "command": ["sh", "-c", f"exit {check_exit}"]}
                    ],
                    "containers": [
                        {"name": "trainer", "image": "t", "command": ["sh", "-c", script],
                         "resources": {"requests": {"nvidia.com/gpu": str(gpus)},
                                       "limits": {"nvidia.com/gpu": str(gpus)}}}
                    ],
                },
            },
        },
    }  # fmt: skip


Scenario = Callable[[Cluster], None]


def completes(run_summary: dict[str, Any]) -> tuple[Scenario, dict[str, Any]]:
    def install(cl: Cluster) -> None:
        cl.batch.create_namespaced_job(cl.namespace, trainer_job(JOB, RELEASE))

    return install, run_summary


def config_error(cl: Cluster) -> None:
    cl.batch.create_namespaced_job(cl.namespace, trainer_job(JOB, RELEASE, check_exit=2, pods=1))


def never_starts(cl: Cluster) -> None:
    cl.batch.create_namespaced_job(cl.namespace, trainer_job(JOB, RELEASE, gpus=99))


class ClusterHelm:
    """Answers helm as the cluster would: `install` creates the scenario's Job, `test` runs the
    run-summary pod and waits for it, `uninstall` deletes the Job."""

    def __init__(self, cl: Cluster, on_install: Scenario, run_summary: dict[str, Any] | None = None) -> None:
        self.cl, self.on_install, self.run_summary = cl, on_install, run_summary
        self.calls: list[list[str]] = []
        self.installed_values: dict[str, Any] | None = None
        self.suspended_at_install: dict[str, bool] = {}

    def __call__(self, argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
        argv = list(argv)
        self.calls.append(argv)
        words, out = argv[1:], ""
        if words[:2] == ["get", "values"]:
            out = json.dumps(INFRA_VALUES)
        elif words[0] == "install":
            self.installed_values = json.loads(Path(argv[argv.index("-f") + 1]).read_text())
            jobs = self.cl.batch.list_namespaced_job(self.cl.namespace).items
            self.suspended_at_install = {j.metadata.name: bool(j.spec.suspend) for j in jobs}
            self.on_install(self.cl)
        elif words[0] == "test":
            name = f"{cs.fullname(RELEASE)}-test-run"
            line = smoke_plan.SUMMARY_MARKER + json.dumps(self.run_summary or {})
            self.cl.create_pod(
                name,
                [{"name": "summary", "image": "t",
                  "command": ["sh", "-c", 'echo "some log line"; echo "$LINE"'],
                  "env": [{"name": "LINE", "value": line.replace("$", "$$")}]}],
                restartPolicy="Never",
            )  # fmt: skip
            self.cl.wait_phase(name, ("Succeeded", "Failed"))
            out = f"TEST SUITE: {name}\nPhase: Succeeded"
        elif words[0] == "uninstall":
            self.cl.batch.delete_namespaced_job(JOB, self.cl.namespace, propagation_policy="Background")
        return subprocess.CompletedProcess(argv, 0, out, "")

    def did(self, verb: str) -> bool:
        return any(c[1] == verb for c in self.calls)


def busy_job(cl: Cluster, name: str) -> None:
    """Another release's training holding both GPU nodes."""
    cl.batch.create_namespaced_job(cl.namespace, trainer_job(name, "trainer", trainer="sleep 600"))
    wait_for(
        f"job {name}'s pods running",
        lambda: (
            sum(
                p.status.phase == "Running"
                for p in cl.core.list_namespaced_pod(cl.namespace, label_selector=f"job-name={name}").items
            )
            == 2
        ),
        60,
    )


def run_smoke(
    cl: Cluster,
    scenario: Scenario | tuple[Scenario, dict[str, Any]],
    tmp_path: Path,
    *extra: str,
    busy: Sequence[str] = (),
) -> tuple[int, ClusterHelm]:
    for name in busy:
        busy_job(cl, name)
    install, run_summary = scenario if isinstance(scenario, tuple) else (scenario, None)
    helm = ClusterHelm(cl, install, run_summary)
    argv = ["--namespace", cl.namespace, "--helm", "helm", "--logs-dir", str(tmp_path / "logs"), *extra]
    rc = cs.main(argv, runner=helm, api_client=cl.api)
    return rc, helm


def pod_names(cl: Cluster, job_name: str = JOB) -> list[str]:
    pods = cl.core.list_namespaced_pod(cl.namespace, label_selector=f"job-name={job_name}").items
    return sorted(p.metadata.name for p in pods)


# -- the flow ---------------------------------------------------------------------------------------
def test_passes_when_both_tiers_recovered(
    cluster: Cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, helm = run_smoke(cluster, completes(summary()), tmp_path)
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "PASS: both tiers recovered" in out
    assert "tier 1, recovered" in out and "tier 2, recovered" in out
    # Pod phases from the pod watch, the scheduler's events from the event watch.
    names = [line.split()[1].rstrip(":") for line in out.splitlines() if line.startswith("  pod ")]
    assert names and all(n.startswith(f"{JOB}-") for n in names)
    assert any(line.endswith(": Succeeded") for line in out.splitlines() if line.startswith("  pod "))
    assert "event: Normal Scheduled" in out and "Successfully assigned" in out
    assert [" ".join(c[1:3]) for c in helm.calls] == [
        "get values",
        f"install {RELEASE}",
        f"test {RELEASE}",
        f"uninstall {RELEASE}",
    ]
    assert all(c[-2:] == ["-n", cluster.namespace] for c in helm.calls)


def test_streams_the_trainer_logs_to_files(cluster: Cluster, tmp_path: Path) -> None:
    rc, _ = run_smoke(cluster, completes(summary()), tmp_path)
    assert rc == 0
    logs = sorted((tmp_path / "logs").glob(f"{JOB}-*.log"))
    assert len(logs) == 2
    for log in logs:
        index = log.name.removeprefix(f"{JOB}-").split("-")[0]
        deadline = time.monotonic() + 10  # the log threads may still be writing the last line
        while time.monotonic() < deadline and "step 59" not in log.read_text():
            time.sleep(0.05)
        assert log.read_text() == f"pod {index} step 0\npod {index} step 59\n"


def test_reads_the_logs_of_pods_that_ended_before_it_watched(cluster: Cluster, tmp_path: Path) -> None:
    """Short pods may end before the pod watch starts (the Job is looked up first): their logs are read
    whole all the same."""

    def install_and_wait(cl: Cluster) -> None:
        cl.batch.create_namespaced_job(cl.namespace, trainer_job(JOB, RELEASE))
        wait_for("both pods ended", lambda: sum(
            p.status.phase == "Succeeded" for p in cl.core.list_namespaced_pod(
                cl.namespace, label_selector=f"job-name={JOB}").items) == 2)  # fmt: skip

    rc, _ = run_smoke(cluster, (install_and_wait, summary()), tmp_path)
    assert rc == 0
    logs = sorted((tmp_path / "logs").glob(f"{JOB}-*.log"))
    assert [log.read_text().splitlines()[-1].split()[-1] for log in logs] == ["59", "59"]


@pytest.mark.parametrize(
    ("run_summary", "reason"),
    [
        (summary(tier1=False), "no recovered tier-1 fault"),
        (summary(tier2=False), "no recovered tier-2 fault"),
        (summary(final=45), "the run stopped at step 45"),
    ],
)
def test_fails_when_a_tier_did_not_recover(
    cluster: Cluster,
    run_summary: dict[str, Any],
    reason: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    rc, helm = run_smoke(cluster, completes(run_summary), tmp_path)
    assert rc == 1
    assert reason in capsys.readouterr().out
    assert not helm.did("uninstall")  # kept for inspection


def test_a_pod_that_exits_2_fails_the_run_with_its_container_and_code(
    cluster: Cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc, helm = run_smoke(cluster, config_error, tmp_path)
    out = capsys.readouterr().out
    assert rc == 1, out
    (name,) = pod_names(cluster)
    expected = f"pod {name}: init container check-config exited 2 (Error): a usage or configuration error"
    assert f"FAIL: {expected}" in out
    assert "FAIL: the Job ended failed" in out
    assert not helm.did("test") and not helm.did("uninstall")


def test_a_job_that_never_starts_is_a_clear_error_after_its_timeout(
    cluster: Cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    started = time.monotonic()
    rc, helm = run_smoke(cluster, never_starts, tmp_path, "--start-timeout", "3")
    elapsed = time.monotonic() - started
    err = capsys.readouterr().err
    assert rc == 2
    pending = ", ".join(f"{n} Pending" for n in pod_names(cluster))
    assert f"job {JOB}: no pod started within 3 s ({pending})" in err
    assert "FailedScheduling" in err and "Insufficient nvidia.com/gpu" in err
    assert 3 <= elapsed < 60
    assert not helm.did("test")


def test_refuses_while_other_training_holds_the_gpus(
    cluster: Cluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    busy = "trainer-9f9f9f"
    rc, helm = run_smoke(cluster, completes(summary()), tmp_path, busy=[busy])
    assert rc == 2
    assert "--suspend-running" in capsys.readouterr().err
    assert not helm.did("install")
    assert not cluster.batch.read_namespaced_job(busy, cluster.namespace).spec.suspend


def test_suspends_and_resumes_other_training(cluster: Cluster, tmp_path: Path) -> None:
    busy = "trainer-9f9f9f"
    rc, helm = run_smoke(cluster, completes(summary()), tmp_path, "--suspend-running", busy=[busy])
    assert rc == 0
    # Suspended before the install (the real Job controller then deleted its pods, freeing the GPU nodes
    # the smoke pods were scheduled to), resumed after.
    assert helm.suspended_at_install == {busy: True}
    assert not cluster.batch.read_namespaced_job(busy, cluster.namespace).spec.suspend


def test_installed_values_render_a_valid_faulted_run(cluster: Cluster, tmp_path: Path) -> None:
    """What the tool installs: Contract 1 kept, valid Kubernetes, flags the trainer accepts."""
    from trainer.config.train_config import config_from_args

    rc, helm = run_smoke(cluster, completes(summary()), tmp_path)
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
