"""Smoke-test a deployed environment: a short faulted run of the chart; did both recovery tiers recover?

For users with a deployed team environment (`cdk deploy`) and a kubeconfig pointing at its cluster:

    python -m tools.cluster_smoke --namespace <team>

1. takes the Contract 1 values (image, nodes, instance type, storage, service account) from the release
   infra installed (`helm get values trainer`), or from `--values FILE`;
2. `helm install`s a second release of k8s/ with smoke values on top: the `small` preset, 60 steps,
   a checkpoint every 10 steps, synthetic tokens written to FSx if missing, and two faults: an exception
   on rank 1 at step 20 (tier 1: in-process restart) and a SIGKILL of the last rank at step 40 (tier 2:
   ft_launcher restarts the workers of that pod);
3. waits for the Job to finish, printing pod phases as they change;
4. runs `helm test` (the node check: GPUs, EFA, FSx, NVMe; the run summary from the event files on FSx)
   and reads the summary the run-summary pod prints (`RUN_SUMMARY {json}`);
5. reports each fault with its tier and recovery time, and exits 0 only if the run completed and a tier-1
   and a tier-2 fault were both recovered. The smoke release is uninstalled on success (kept on failure,
   or with --keep, for inspection).

A training Job of another release holding the GPU nodes (the infra release starts one) would keep the
smoke pods pending: the tool refuses to start then, unless --suspend-running, which suspends those Jobs
(their pods stop; they resume from their last checkpoint) and resumes them at the end.

`--render-only` prints the smoke release's manifests (helm template) with chart defaults or --values,
touching no cluster. Exit codes: 0 both tiers recovered, 1 they did not (or the run failed), 2 usage or
environment error.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CHART = REPO_ROOT / "k8s"
DEFAULT_HELM = REPO_ROOT / ".tools" / "bin" / "helm"
INFRA_RELEASE = "trainer"  # infra/trainer_release.py TRAINER_RELEASE
SUMMARY_MARKER = "RUN_SUMMARY "
TRAINER_SELECTOR = "app.kubernetes.io/part-of=nvrx-eks-blueprint,app.kubernetes.io/component=trainer"

# Contract 1 (docs/design.md): the values infra sets; the smoke run keeps them and overrides the rest.
# `suspend` is left out on purpose: infra installs its release suspended, and a smoke run must start.
CONTRACT_1_KEYS = (
    "image",
    "nodes",
    "instanceType",
    "gpusPerNode",
    "efaPerNode",
    "storage",
    "serviceAccountName",
)


class SmokeError(RuntimeError):
    """The smoke run could not be carried out (environment or usage problem, exit code 2)."""


@dataclass(frozen=True)
class SmokePlan:
    """What the smoke run trains and which faults it injects."""

    steps: int = 60
    soft_fault_step: int = 20
    hard_fault_step: int = 40
    ckpt_interval: int = 10
    preset: str = "small"
    seq_len: int = 512
    micro_batch_size: int = 4
    synthetic_tokens: int = 4_000_000
    data_path: str = "/fsx/data/smoke-tokens-small.npy"

    def __post_init__(self) -> None:
        if not 0 < self.soft_fault_step < self.hard_fault_step < self.steps:
            raise SmokeError("fault steps must satisfy 0 < soft_fault_step < hard_fault_step < steps")
        if self.ckpt_interval >= self.hard_fault_step - self.soft_fault_step:
            raise SmokeError("ckpt_interval must be shorter than the gap between the faults")


def smoke_values(
    base: dict[str, Any], plan: SmokePlan, run_name: str, nodes: int | None = None
) -> dict[str, Any]:
    """Chart values of the smoke release: the environment's Contract 1 values plus the smoke run."""
    values = {key: base[key] for key in CONTRACT_1_KEYS if key in base}
    if nodes is not None:
        values["nodes"] = nodes
    world = int(values.get("nodes", 2)) * int(values.get("gpusPerNode", 8))
    if world < 2:
        raise SmokeError("the smoke run needs at least 2 ranks (nodes x gpusPerNode)")
    values.update(
        {
            "runName": run_name,
            "preset": plan.preset,
            "seqLen": plan.seq_len,
            "microBatchSize": plan.micro_batch_size,
            "steps": plan.steps,
            "ckptInterval": plan.ckpt_interval,
            "ckptKeep": 2,
            "dataPath": plan.data_path,
            "syntheticTokens": plan.synthetic_tokens,
            "faults": {
                # Tier 1: a Python exception on one rank; the in-process Wrapper restarts every rank.
                "soft": f"exception:step={plan.soft_fault_step}:rank=1",
                # Tier 2: a rank process dies; ft_launcher restarts the workers. The last rank lives on
                # the last pod, so with several nodes the restart crosses pods.
                "hard": f"sigkill:step={plan.hard_fault_step}:rank={world - 1}",
            },
            # A smoke run that hangs should not hold GPU nodes for long.
            "activeDeadlineSeconds": 3600,
        }
    )
    return values


def fullname(release: str, chart_name: str = "trainer") -> str:
    """The chart's `trainer.fullname` for a release without overrides (k8s/templates/_helpers.tpl)."""
    name = release if chart_name in release else f"{release}-{chart_name}"
    return name[:40].rstrip("-")


def job_state(job: dict[str, Any]) -> str:
    """`complete`, `failed` or `running`, from a Job's status conditions."""
    for condition in job.get("status", {}).get("conditions", []) or []:
        if condition.get("status") != "True":
            continue
        if condition.get("type") in ("Complete", "SuccessCriteriaMet"):
            return "complete"
        if condition.get("type") in ("Failed", "FailureTarget"):
            return "failed"
    return "running"


def parse_summary(log: str) -> dict[str, Any]:
    """The run summary the run-summary test pod prints as `RUN_SUMMARY {json}`."""
    lines = [ln for ln in log.splitlines() if ln.startswith(SUMMARY_MARKER)]
    if not lines:
        raise SmokeError("the run-summary pod printed no RUN_SUMMARY line")
    return dict(json.loads(lines[-1][len(SUMMARY_MARKER) :]))


@dataclass
class Verdict:
    """Whether the smoke run passed, and the report lines that say why."""

    ok: bool
    lines: list[str] = field(default_factory=list)


def evaluate(summary: dict[str, Any], plan: SmokePlan) -> Verdict:
    """Pass when the run completed every step and a tier-1 and a tier-2 fault were both recovered."""
    lines = []
    steps, final = summary.get("steps"), summary.get("final_step")
    eff = summary.get("training_efficiency")
    lines.append(f"status {summary.get('status')}: {steps} steps kept, final step {final}")
    if eff is not None:
        lines.append(
            f"training efficiency {eff:.1%} (productive {summary.get('productive_s', 0):.1f} s "
            f"of {summary.get('wall_s', 0):.1f} s wall)"
        )
    recovered_tiers = set()
    for fault in summary.get("faults", []):
        mttr = fault.get("mttr_s")
        mttr_text = f"{mttr:.1f} s" if isinstance(mttr, int | float) else "-"
        state = "recovered" if fault.get("recovered") else "NOT recovered"
        lines.append(
            f"fault {fault.get('type')} at step {fault.get('step')} on rank {fault.get('rank')}: "
            f"tier {fault.get('tier')}, {state}, time to resume {mttr_text}"
        )
        if fault.get("recovered") and fault.get("tier") in (1, 2):
            recovered_tiers.add(int(fault["tier"]))
    problems = []
    if summary.get("status") != "completed":
        problems.append(f"the run did not complete (status {summary.get('status')})")
    if final is None or int(final) < plan.steps - 1:
        problems.append(f"the run stopped at step {final}, expected {plan.steps - 1}")
    for tier in (1, 2):
        if tier not in recovered_tiers:
            problems.append(f"no recovered tier-{tier} fault")
    lines.extend(f"FAIL: {p}" for p in problems)
    lines.append("PASS: both tiers recovered" if not problems else "smoke run FAILED")
    return Verdict(ok=not problems, lines=lines)


Runner = Callable[[Sequence[str]], subprocess.CompletedProcess[str]]


def run_command(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    """Run a command, capturing its output (the default Runner)."""
    return subprocess.run(list(argv), capture_output=True, text=True, check=False)


@dataclass
class Cluster:
    """helm and kubectl against one namespace, through a Runner (replaced by a fake in tests)."""

    namespace: str
    helm: str
    kubectl: str
    runner: Runner = run_command
    log: Callable[[str], None] = print

    def run(self, argv: Sequence[str], check: bool = True) -> subprocess.CompletedProcess[str]:
        result = self.runner(argv)
        if check and result.returncode != 0:
            raise SmokeError(
                f"{' '.join(argv[:3])} ... failed ({result.returncode}): {result.stderr.strip()}"
            )
        return result

    def kube(self, *args: str) -> list[str]:
        return [self.kubectl, "-n", self.namespace, *args]

    def helm_cmd(self, *args: str) -> list[str]:
        return [self.helm, *args, "-n", self.namespace]

    def release_values(self, release: str) -> dict[str, Any]:
        out = self.run(self.helm_cmd("get", "values", release, "-o", "json")).stdout
        return dict(json.loads(out or "{}") or {})

    def active_trainer_jobs(self) -> list[str]:
        """Names of unsuspended, unfinished trainer Jobs (of any release) in the namespace."""
        jobs = json.loads(self.run(self.kube("get", "jobs", "-l", TRAINER_SELECTOR, "-o", "json")).stdout)
        return [
            j["metadata"]["name"]
            for j in jobs.get("items", [])
            if job_state(j) == "running" and not j.get("spec", {}).get("suspend")
        ]

    def set_suspended(self, job: str, suspended: bool) -> None:
        patch = json.dumps({"spec": {"suspend": suspended}})
        self.run(self.kube("patch", "job", job, "--type=merge", "-p", patch))

    def job(self, name: str) -> dict[str, Any]:
        return dict(json.loads(self.run(self.kube("get", "job", name, "-o", "json")).stdout))

    def pod_phases(self, release: str) -> str:
        selector = f"app.kubernetes.io/instance={release},app.kubernetes.io/component=trainer"
        out = self.run(self.kube("get", "pods", "-l", selector, "-o", "json"), check=False).stdout
        try:
            pods = json.loads(out).get("items", [])
        except json.JSONDecodeError:
            return "?"
        counts: dict[str, int] = {}
        for pod in pods:
            phase = pod.get("status", {}).get("phase", "Unknown")
            counts[phase] = counts.get(phase, 0) + 1
        return ", ".join(f"{n} {phase}" for phase, n in sorted(counts.items())) or "no pods yet"


def install_command(
    cluster: Cluster, release: str, chart: Path, values_file: Path, timeout_s: int
) -> list[str]:
    """`helm install` of the smoke release; the values file carries Contract 1 plus the smoke values."""
    return cluster.helm_cmd(
        "install", release, str(chart), "-f", str(values_file), "--timeout", f"{timeout_s}s"
    )


def wait_for_job(
    cluster: Cluster,
    job: str,
    release: str,
    timeout_s: float,
    poll_s: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> str:
    """Poll the Job until it completes or fails (returns the state), printing pod phases when they change."""
    deadline = clock() + timeout_s
    last = ""
    while True:
        state = job_state(cluster.job(job))
        phases = cluster.pod_phases(release)
        if phases != last:
            cluster.log(f"  pods: {phases}")
            last = phases
        if state != "running":
            return state
        if clock() >= deadline:
            raise SmokeError(f"job {job} did not finish within {timeout_s:.0f} s")
        sleep(poll_s)


def smoke(args: argparse.Namespace, cluster: Cluster, plan: SmokePlan) -> Verdict:
    """The whole smoke run against a cluster (see the module docstring)."""
    log = cluster.log
    base = (
        yaml.safe_load(Path(args.values).read_text())
        if args.values
        else cluster.release_values(args.from_release)
    )
    missing = [key for key in ("image", "nodes", "storage") if key not in (base or {})]
    if missing:
        raise SmokeError(
            f"no Contract 1 values {missing} in the base values; pass --values or --from-release"
        )
    run_name = f"{args.release}-{datetime.now(UTC):%Y%m%d-%H%M%S}"
    values = smoke_values(base, plan, run_name, args.nodes)

    busy = cluster.active_trainer_jobs()
    if busy and not args.suspend_running:
        raise SmokeError(
            f"training Jobs {busy} hold the GPU nodes; wait for them, or pass --suspend-running to suspend "
            "them during the smoke run (they resume from their last checkpoint afterwards)"
        )
    for job in busy:
        log(f"suspending job {job} for the smoke run")
        cluster.set_suspended(job, True)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            values_file = Path(tmp) / "smoke-values.json"
            values_file.write_text(json.dumps(values, indent=2))
            log(
                f"installing release {args.release} (run {run_name}, {values['nodes']} nodes, "
                f"faults {values['faults']['soft']} and {values['faults']['hard']})"
            )
            cluster.run(install_command(cluster, args.release, Path(args.chart), values_file, 300))
        job = fullname(args.release)
        state = wait_for_job(cluster, job, args.release, args.timeout, args.poll)
        log(f"job {job}: {state}")
        test = cluster.run(cluster.helm_cmd("test", args.release, "--timeout", "15m"), check=False)
        log(test.stdout.strip())
        summary_log = cluster.run(cluster.kube("logs", f"{job}-test-run", "-c", "summary")).stdout
        verdict = evaluate(parse_summary(summary_log), plan)
        if state != "complete":
            verdict.ok = False
            verdict.lines.append(f"FAIL: the Job ended {state}")
        if test.returncode != 0:  # the node check (GPUs, EFA, FSx, NVMe) or the run summary failed
            verdict.ok = False
            verdict.lines.append(f"FAIL: helm test failed: {test.stderr.strip()}")
        if verdict.ok and not args.keep:
            cluster.run(cluster.helm_cmd("uninstall", args.release), check=False)
            log(f"uninstalled {args.release} (its checkpoints and events stay on FSx under runs/{run_name})")
        return verdict
    finally:
        for job in busy:
            log(f"resuming job {job}")
            cluster.set_suspended(job, False)


def render_only(args: argparse.Namespace, plan: SmokePlan, out: Callable[[str], None] = print) -> int:
    """Print the smoke release's manifests (helm template) without a cluster."""
    base = yaml.safe_load(Path(args.values).read_text()) if args.values else {}
    defaults = yaml.safe_load((Path(args.chart) / "values.yaml").read_text())
    base = {**{k: defaults[k] for k in CONTRACT_1_KEYS if k in defaults}, **(base or {})}
    values = smoke_values(base, plan, f"{args.release}-render", args.nodes)
    with tempfile.TemporaryDirectory() as tmp:
        values_file = Path(tmp) / "smoke-values.json"
        values_file.write_text(json.dumps(values, indent=2))
        result = run_command(
            [args.helm, "template", args.release, args.chart, "-n", args.namespace, "-f", str(values_file)]
        )
    if result.returncode != 0:
        raise SmokeError(f"helm template failed: {result.stderr.strip()}")
    out(result.stdout)
    return 0


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m tools.cluster_smoke",
        description="Install a short faulted training run on a deployed environment and check that both "
        "recovery tiers recovered.",
    )
    parser.add_argument("--namespace", "-n", default="default", help="the team namespace (the team's name)")
    parser.add_argument("--release", default="trainer-smoke", help="name of the smoke release")
    parser.add_argument(
        "--from-release", default=INFRA_RELEASE, help="release whose Contract 1 values to reuse (infra's)"
    )
    parser.add_argument(
        "--values", help="a values file with the Contract 1 values, instead of --from-release"
    )
    parser.add_argument("--nodes", type=int, help="pods of the smoke run (default: the environment's nodes)")
    parser.add_argument("--chart", default=str(DEFAULT_CHART), help="the chart directory")
    parser.add_argument("--helm", default=str(DEFAULT_HELM), help="helm binary")
    parser.add_argument("--kubectl", default="kubectl", help="kubectl binary")
    parser.add_argument("--timeout", type=float, default=2400, help="seconds to wait for the Job")
    parser.add_argument("--poll", type=float, default=10, help="seconds between status polls")
    parser.add_argument("--keep", action="store_true", help="keep the smoke release after a pass")
    parser.add_argument(
        "--suspend-running", action="store_true", help="suspend other trainer Jobs during the smoke run"
    )
    parser.add_argument("--render-only", action="store_true", help="print the manifests; no cluster")
    return parser


def main(argv: Sequence[str] | None = None, runner: Runner = run_command) -> int:
    args = make_parser().parse_args(argv)
    plan = SmokePlan()
    try:
        if args.render_only:
            return render_only(args, plan)
        cluster = Cluster(args.namespace, args.helm, args.kubectl, runner)
        verdict = smoke(args, cluster, plan)
    except SmokeError as exc:
        print(f"cluster smoke: {exc}", file=sys.stderr)
        return 2
    print("\n".join(verdict.lines))
    return 0 if verdict.ok else 1


if __name__ == "__main__":
    sys.exit(main())
