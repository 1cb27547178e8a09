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

A training Job of another release holding the GPU nodes (the infra release starts one) would keep the
smoke pods pending: the tool refuses to start then, unless --suspend-running, which suspends those Jobs
(their pods stop; they resume from their last checkpoint) and resumes them at the end.

Not yet run against a real cluster: its tests drive the real client against a local HTTP endpoint that
serves the API paths it calls (tests/tools/). `--render-only` prints the smoke release's manifests
(helm template) touching no cluster. Exit codes: 0 both tiers recovered, 1 they did not (or the run
failed), 2 usage or environment error.
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

from tools.kube_watch import Kube
from tools.smoke_plan import (
    CONTRACT_1_KEYS,
    SmokeError,
    SmokePlan,
    Verdict,
    evaluate,
    parse_summary,
    smoke_values,
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


def smoke(args: argparse.Namespace, helm: Helm, kube: Kube, plan: SmokePlan) -> Verdict:
    """The whole smoke run against a cluster (see the module docstring)."""
    log = kube.log
    run_name = f"{args.release}-{datetime.now(UTC):%Y%m%d-%H%M%S}"
    values = smoke_values(base_values(args, helm), plan, run_name, args.nodes)

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
