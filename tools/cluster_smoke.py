"""Smoke-test a deployed environment: a short faulted run of the chart; did both recovery tiers recover?

For users with a deployed team environment (`cdk deploy`) and a kubeconfig pointing at its cluster:

    python -m tools.cluster_smoke --namespace <team>

1. takes the Contract 1 values (image, nodes, instance type, storage, service account) from the release
   infra installed (`helm get values trainer`), or from `--values FILE`;
2. `helm install`s a second release of k8s/ with smoke values on top (tools/smoke_plan.py: the `small`
   preset, 60 steps, synthetic tokens, an exception on rank 1 at step 20 for tier 1 and a SIGKILL of
   the last rank at step 40 for tier 2);
3. follows the Job through the Kubernetes API (tools/kube_watch.py, the official `kubernetes` client):
   pod phases, container exit codes and the events about the Job and its pods as they happen, each
   trainer pod's log streamed to --logs-dir. A Job whose pods never leave Pending (no GPU nodes, quota)
   stops the run after --start-timeout with the last events (e.g. FailedScheduling);
4. runs `helm test` (the node check: GPUs, EFA, FSx, NVMe; the run summary from the event files on FSx)
   and reads the summary the run-summary pod prints (`RUN_SUMMARY {json}`) through the API;
5. reports each fault with its tier and recovery time, and exits 0 only if the run completed and a tier-1
   and a tier-2 fault were both recovered. The smoke release is uninstalled on success (kept on failure,
   or with --keep, for inspection).

With `--teams FILE` (the team: `--team`, default the namespace) a storage step runs first: a Job of one
`python -m trainer.checkpoint.storage_probe` pod per node, all at once, writing and reading back files the
size of one rank's checkpoint shard (one per GPU) on the team's FSx claim; the per-node and aggregate MB/s are
printed against what the sizing package expects of the team's file system (tools/smoke_plan.py), and a figure
below `--storage-fraction` of it fails the smoke run with the numbers. `--storage-local DIR` runs the same
step here instead, `--local-nodes` probe processes at once against a local directory, and nothing else.

A training Job of another release holding the GPU nodes (the infra release starts one) would keep the
smoke pods pending: the tool refuses to start then, unless --suspend-running, which suspends those Jobs
(their pods stop; they resume from their last checkpoint) and resumes them at the end.

Not yet run against EKS: its tests (tests/tools/test_cluster_smoke.py) drive it against a real API server,
controller manager and scheduler (tools/controlplane) whose pods a process kubelet runs (tools/kubelet):
watches, events, pod logs through the API server's `pods/log`, Job suspension. `--render-only` prints
the smoke release's manifests (helm template) touching no cluster. Exit codes: 0 both tiers recovered,
1 they did not (or the run failed), 2 usage or environment error.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import yaml

from sizing import size
from sizing.teamfile import TeamSizingError, find_team, team_inputs
from sizing.yaml_readings import load_unambiguous
from tools.kube_watch import Kube, release_selector
from tools.smoke_plan import (
    CONTRACT_1_KEYS,
    DEFAULT_PROBE_CAP_BYTES,
    DEFAULT_PROBE_TIME_LIMIT_S,
    DEFAULT_STORAGE_FRACTION,
    SmokeError,
    SmokePlan,
    StorageExpectation,
    Verdict,
    evaluate,
    evaluate_storage,
    parse_probe_lines,
    parse_summary,
    probe_args,
    probe_job,
    smoke_values,
    storage_expectation,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CHART = REPO_ROOT / "k8s"
DEFAULT_HELM = REPO_ROOT / ".tools" / "bin" / "helm"
INFRA_RELEASE = "trainer"  # infra/trainer_release.py TRAINER_RELEASE

Runner = Callable[[Sequence[str]], subprocess.CompletedProcess[str]]


def run_command(argv: Sequence[str]) -> subprocess.CompletedProcess[str]:
    """Run a command, capturing its output (the default Runner)."""
    return subprocess.run(list(argv), capture_output=True, text=True, check=False)


def fullname(release: str, chart_name: str = "trainer") -> str:
    """The chart's `trainer.fullname` for a release without overrides (k8s/templates/_helpers.tpl): the
    prefix of the test pods' names. The Job's own name adds a digest and is looked up by label."""
    name = release if chart_name in release else f"{release}-{chart_name}"
    return name[:40].rstrip("-")


class Helm:
    """The helm binary against one namespace, through a Runner (a fake in tests)."""

    def __init__(self, binary: str, namespace: str, runner: Runner = run_command) -> None:
        self.binary, self.namespace, self.runner = binary, namespace, runner

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        argv = [self.binary, *args, "-n", self.namespace]
        result = self.runner(argv)
        if check and result.returncode != 0:
            raise SmokeError(
                f"helm {' '.join(args[:2])} ... failed ({result.returncode}): {result.stderr.strip()}"
            )
        return result

    def release_values(self, release: str) -> dict[str, Any]:
        return dict(json.loads(self.run("get", "values", release, "-o", "json").stdout or "{}") or {})

    def install(self, release: str, chart: Path, values: dict[str, Any], timeout_s: int = 300) -> None:
        """`helm install`; the values go in as a file, so every value keeps its type."""
        with tempfile.TemporaryDirectory() as tmp:
            values_file = Path(tmp) / "smoke-values.json"
            values_file.write_text(json.dumps(values, indent=2))
            self.run("install", release, str(chart), "-f", str(values_file), "--timeout", f"{timeout_s}s")


def base_values(args: argparse.Namespace, helm: Helm) -> dict[str, Any]:
    """The environment's Contract 1 values: from --values, or from the infra release."""
    base = (
        yaml.safe_load(Path(args.values).read_text())
        if args.values
        else helm.release_values(args.from_release)
    )
    missing = [key for key in ("image", "nodes", "storage") if key not in (base or {})]
    if missing:
        raise SmokeError(
            f"no Contract 1 values {missing} in the base values; pass --values or --from-release"
        )
    return dict(base)


def team_expectation(args: argparse.Namespace, nodes: int | None = None) -> StorageExpectation | None:
    """The storage step's expectation: the team's sizing (--teams) or the aggregate given; None: no step."""
    if args.teams is None and args.storage_expect_mbps is None:
        return None
    if args.teams is None:
        count = nodes or args.local_nodes or 1
        return StorageExpectation(
            nodes=count,
            files_per_node=args.storage_files or 1,
            bytes_per_file=args.storage_cap_bytes,
            aggregate_mbps=args.storage_expect_mbps,
            fsx_mbps=args.storage_expect_mbps,
            fraction=args.storage_fraction,
        )
    try:
        data = load_unambiguous(Path(args.teams).read_text(encoding="utf-8"))
        sizing = size(team_inputs(find_team(data, args.team or args.namespace)))
    except (OSError, yaml.YAMLError, TeamSizingError, ValueError) as exc:
        raise SmokeError(f"--teams {args.teams}: {exc}".replace("\n", " ")) from None
    exp = storage_expectation(sizing, args.storage_fraction, args.storage_cap_bytes, nodes)
    if args.storage_expect_mbps is not None:
        exp = StorageExpectation(
            exp.nodes, exp.files_per_node, exp.bytes_per_file, args.storage_expect_mbps, exp.fsx_mbps,
            exp.fraction,
        )  # fmt: skip
    if args.storage_files:
        exp = StorageExpectation(
            exp.nodes, args.storage_files, exp.bytes_per_file, exp.aggregate_mbps, exp.fsx_mbps, exp.fraction
        )
    return exp


def local_storage_step(
    exp: StorageExpectation, directory: Path, time_limit_s: float, log: Callable[[str], None] = print
) -> Verdict:
    """The storage step against a local directory: one probe process per "node", all at once."""
    start_at = datetime.now(UTC).timestamp() + 1.0  # every process imports, then they start together
    procs = []
    for n in range(exp.nodes):
        argv = probe_args(exp, str(directory / f"node-{n}"), time_limit_s, start_at)
        argv[0] = sys.executable
        procs.append(
            subprocess.Popen(
                [*argv, f"--node=local-{n}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
    results, errors = [], []
    for proc in procs:
        out, err = proc.communicate(timeout=time_limit_s + 60)
        results += parse_probe_lines(out)
        if proc.returncode != 0:
            errors.append(err.strip().splitlines()[-1] if err.strip() else f"exit {proc.returncode}")
    if errors:
        raise SmokeError(f"the storage probe failed: {errors[0]}")
    return evaluate_storage(results, exp)


def cluster_storage_step(
    args: argparse.Namespace, kube: Kube, base: dict[str, Any], exp: StorageExpectation, run_name: str
) -> Verdict:
    """The storage step on the cluster: the probe Job (one pod per node at once), its lines, its verdict."""
    release = f"{args.release}-storage"
    job_name = f"{release}-{datetime.now(UTC):%H%M%S}"
    start_at = datetime.now(UTC).timestamp() + args.storage_start_slack
    body: Any = probe_job(base, exp, job_name, release, run_name, args.storage_time_limit, start_at)
    kube.log(
        f"storage step: job {job_name}, {exp.nodes} pods x {exp.files_per_node} files of "
        f"{exp.bytes_per_file / 1e6:,.0f} MB on {base.get('storage', {}).get('claimName', 'fsx-shared')}"
    )
    kube.batch.create_namespaced_job(kube.namespace, body)
    try:
        outcome = kube.follow(
            job_name, release, args.start_timeout, args.storage_time_limit + args.start_timeout
        )
        pods = kube.core.list_namespaced_pod(kube.namespace, label_selector=release_selector(release)).items
        names = [str(pod.metadata.name) for pod in pods if pod.metadata is not None]
        results = [r for name in names for r in parse_probe_lines(kube.pod_log(name, "probe"))]
        verdict = evaluate_storage(results, exp)
        if outcome.state != "complete":
            verdict.ok = False
            verdict.lines += [f"FAIL: storage: {e.describe()}" for e in outcome.failures]
            verdict.lines.append(f"FAIL: storage: the probe Job ended {outcome.state}")
        return verdict
    finally:
        kube.batch.delete_namespaced_job(job_name, kube.namespace, propagation_policy="Background")


def smoke(args: argparse.Namespace, helm: Helm, kube: Kube, plan: SmokePlan) -> Verdict:
    """The whole smoke run against a cluster (see the module docstring)."""
    log = kube.log
    run_name = f"{args.release}-{datetime.now(UTC):%Y%m%d-%H%M%S}"
    base = base_values(args, helm)
    values = smoke_values(base, plan, run_name, args.nodes)
    exp = team_expectation(args, int(values["nodes"]))

    busy = kube.active_trainer_jobs()
    if busy and not args.suspend_running:
        raise SmokeError(
            f"training Jobs {busy} hold the GPU nodes; wait for them, or pass --suspend-running to suspend "
            "them during the smoke run (they resume from their last checkpoint afterwards)"
        )
    for job in busy:
        log(f"suspending job {job} for the smoke run")
        kube.set_suspended(job, True)
    try:
        storage = cluster_storage_step(args, kube, base, exp, run_name) if exp is not None else None
        if storage is not None:
            log("\n".join(storage.lines))
            if not storage.ok:
                return storage  # the file system cannot carry the checkpoints: no training run on it
        log(
            f"installing release {args.release} (run {run_name}, {values['nodes']} nodes, "
            f"faults {values['faults']['soft']} and {values['faults']['hard']})"
        )
        helm.install(args.release, Path(args.chart), values)
        job = kube.release_job(args.release)
        outcome = kube.follow(job, args.release, args.start_timeout, args.timeout)
        log(f"job {job}: {outcome.state}")
        if outcome.state != "complete":
            # No run summary to judge: say which containers failed and how.
            lines = [f"FAIL: {e.describe()}" for e in outcome.failures]
            lines += [f"FAIL: the Job ended {outcome.state}", "smoke run FAILED"]
            return Verdict(ok=False, lines=lines)
        test = helm.run("test", args.release, "--timeout", "15m", check=False)
        log(test.stdout.strip())
        verdict = evaluate(parse_summary(kube.pod_log(f"{fullname(args.release)}-test-run", "summary")), plan)
        if test.returncode != 0:  # the node check (GPUs, EFA, FSx, NVMe) or the run summary failed
            verdict.ok = False
            verdict.lines.append(f"FAIL: helm test failed: {test.stderr.strip()}")
        if storage is not None:
            verdict.lines[:0] = storage.lines
        if verdict.ok and not args.keep:
            helm.run("uninstall", args.release, check=False)
            log(f"uninstalled {args.release} (its checkpoints and events stay on FSx under runs/{run_name})")
        return verdict
    finally:
        for job in busy:
            log(f"resuming job {job}")
            kube.set_suspended(job, False)


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
    parser.add_argument("--context", help="kubeconfig context (default: the current one)")
    parser.add_argument("--timeout", type=float, default=2400, help="seconds to wait for the Job to finish")
    parser.add_argument(
        "--start-timeout", type=float, default=900, help="seconds for the first pod to leave Pending"
    )
    parser.add_argument(
        "--logs-dir", default="out/smoke/logs", help="where the trainer pods' logs are streamed"
    )
    parser.add_argument("--keep", action="store_true", help="keep the smoke release after a pass")
    parser.add_argument(
        "--suspend-running", action="store_true", help="suspend other trainer Jobs during the smoke run"
    )
    parser.add_argument("--render-only", action="store_true", help="print the manifests; no cluster")
    storage = parser.add_argument_group("storage step (trainer.checkpoint.storage_probe against the sizing)")
    storage.add_argument("--teams", help="teams file: run the storage step with this team's sizing")
    storage.add_argument("--team", help="the team in --teams (default: the namespace)")
    storage.add_argument(
        "--storage-fraction",
        type=float,
        default=DEFAULT_STORAGE_FRACTION,
        help=f"fail below this share of the expected MB/s (default {DEFAULT_STORAGE_FRACTION})",
    )
    storage.add_argument(
        "--storage-time-limit",
        type=float,
        default=DEFAULT_PROBE_TIME_LIMIT_S,
        help=f"seconds each probe may take (default {DEFAULT_PROBE_TIME_LIMIT_S:g})",
    )
    storage.add_argument(
        "--storage-cap-bytes",
        type=int,
        default=DEFAULT_PROBE_CAP_BYTES,
        help="at most this many bytes per file, whatever the shard size",
    )
    storage.add_argument("--storage-files", type=int, help="files per node (default: GPUs per node)")
    storage.add_argument(
        "--storage-expect-mbps", type=float, help="expected aggregate MB/s instead of the sizing's"
    )
    storage.add_argument(
        "--storage-start-slack",
        type=float,
        default=180.0,
        help="seconds from creating the probe Job to the pods' common start (image pull, scheduling)",
    )
    storage.add_argument("--storage-local", help="run only the storage step, here, against this directory")
    storage.add_argument("--local-nodes", type=int, default=2, help="probe processes with --storage-local")
    return parser


def kube_client(context: str | None) -> Any:
    """An API client from the kubeconfig (as kubectl and helm would use it)."""
    from kubernetes import client, config

    try:
        config.load_kube_config(context=context)
    except Exception as exc:  # no kubeconfig, unknown context: an environment error
        raise SmokeError(f"cannot load the kubeconfig: {exc}") from exc
    return client.ApiClient()


def main(
    argv: Sequence[str] | None = None, runner: Runner = run_command, api_client: Any | None = None
) -> int:
    args = make_parser().parse_args(argv)
    plan = SmokePlan()
    try:
        if args.storage_local:
            exp = team_expectation(args, args.local_nodes)
            if exp is None:
                raise SmokeError("--storage-local needs --teams (the sizing) or --storage-expect-mbps")
            verdict = local_storage_step(exp, Path(args.storage_local), args.storage_time_limit)
            print("\n".join(verdict.lines))
            return 0 if verdict.ok else 1
        if args.render_only:
            return render_only(args, plan)
        api = api_client if api_client is not None else kube_client(args.context)
        kube = Kube(api, args.namespace, logs_dir=Path(args.logs_dir))
        verdict = smoke(args, Helm(args.helm, args.namespace, runner), kube, plan)
    except SmokeError as exc:
        print(f"cluster smoke: {exc}", file=sys.stderr)
        return 2
    print("\n".join(verdict.lines))
    return 0 if verdict.ok else 1


if __name__ == "__main__":
    sys.exit(main())
