"""`make demo-cluster`: the demo's faulted smoke run on a real Kubernetes control plane.

The same run as `make demo` (tools/demo.py: the default team synthesized, its trainer release's values
plus tools/demo-values.yaml), but instead of the local stand-in (tools/localjob.py) playing the Job
controller and the rendezvous Deployment:

1. a real etcd, kube-apiserver, controller manager and scheduler start (tools/controlplane);
2. a process kubelet (tools/kubelet) registers the team's GPU nodes (one per pod, plus one free node a
   replacement can land on) and a system node, and runs whatever pods are bound to them;
3. what infra creates in the team's namespace is created: the namespace, the service account, the FSx
   claim (a statically bound volume, one folder every node shares) and the checkpoint key Secret;
4. the chart is installed with the real helm: the real Job controller creates the Indexed Job's pods, the
   Deployment controller the rendezvous service's pod, the EndpointSlice controller its endpoints; the
   scheduler places them by the chart's nodeSelector, tolerations and GPU requests;
5. the node-loss fault kills its pod whole (trainer/faults.py); the harness then loses that pod's node
   (tools/kubelet `lose_node`: heartbeats stop, NotReady, tainted) as a lost instance would be, so the
   real Job controller's replacement, created under the chart's podFailurePolicy/backoffLimitPerIndex,
   lands on another node with an empty NVMe and /dev/shm;
6. `helm test` runs the chart's run-summary pod (the node check, which needs nvidia-smi, is filtered
   out);
7. the report is tools/demo.py's, from the run's event files on the shared claim and the pods' logs read
   through the API server (`pods/log`, served by the kubelet).

`--compare` runs the stand-in demo first (out/demo) and this one after it (out/demo-cluster) and prints
their figures side by side.

What differs from a cluster, and why: every pod shares this machine (127.0.0.1, the cluster DNS names the
chart's env names rewritten to it by the kubelet); the pod's /dev/shm is a folder of the kubelet's, which
the trainer is told through `--snapshot-dir=/dev/shm/...` (extraTrainerArgs: on a cluster the same
path is its default); rdzvPort is a free port of this machine.
"""

from __future__ import annotations

import argparse
import itertools
import json
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config

from tools import demo
from tools.cluster_smoke import fullname as cs_fullname
from tools.controlplane.launch import ControlPlane, ControlPlaneError, binaries, running_control_plane
from tools.kubelet.kubelet import ProcessKubelet
from tools.kubelet.nodes import gpu_node, system_node
from trainer.runtime.ports import free_port

REPO = Path(__file__).resolve().parent.parent
HELM = REPO / ".tools" / "bin" / "helm"
FSX_VOLUME_PATH = "/fsx"
"""The FSx volume's path in its PersistentVolume: the kubelet keeps it under its storage root."""
SHM_SNAPSHOTS = "/dev/shm/trainer-snapshots"
NODE_LOSS_EXIT = 137
"""A pod killed whole (SIGKILL) exits 137: the node-loss fault's mark."""


def say(message: str) -> None:
    print(f"[demo-cluster] {message}", flush=True)


# -- the team's namespace, as infra leaves it ----------------------------------------------------------
def prepare_namespace(core: client.CoreV1Api, values: dict[str, Any], namespace: str) -> None:
    """The namespace, the trainer's service account, the FSx claim bound to a volume of its own, and the
    checkpoint key Secret (infra's part of Contract 5)."""
    core.create_namespace({"metadata": {"name": namespace}})
    deadline = time.monotonic() + 60
    while not any(
        sa.metadata.name == "default" for sa in core.list_namespaced_service_account(namespace).items
    ):
        if time.monotonic() > deadline:
            raise SystemExit(f"demo-cluster: namespace {namespace} got no default service account")
        time.sleep(0.2)
    account = values.get("serviceAccountName") or "default"
    if account != "default":
        core.create_namespaced_service_account(namespace, {"metadata": {"name": account}})
    claim = values["storage"]["claimName"]
    volume = f"{namespace}-{claim}"
    core.create_persistent_volume(
        {"metadata": {"name": volume},
         "spec": {"capacity": {"storage": "1200Gi"}, "accessModes": ["ReadWriteMany"], "storageClassName": "",
                  "persistentVolumeReclaimPolicy": "Retain", "hostPath": {"path": FSX_VOLUME_PATH},
                  "claimRef": {"namespace": namespace, "name": claim}}}
    )  # fmt: skip
    core.create_namespaced_persistent_volume_claim(
        namespace,
        {"metadata": {"name": claim},
         "spec": {"accessModes": ["ReadWriteMany"], "storageClassName": "", "volumeName": volume,
                  "resources": {"requests": {"storage": "1200Gi"}}}},
    )  # fmt: skip
    secret = (values.get("checkpointKey") or {}).get("secretName", "checkpoint-key")
    core.create_namespaced_secret(
        namespace, {"metadata": {"name": secret}, "stringData": {"checkpoint.key": secrets.token_hex(32)}}
    )


# -- helm ------------------------------------------------------------------------------------------
def helm_install(plane: ControlPlane, namespace: str, values_files: list[Path]) -> None:
    cmd = [str(HELM), "install", demo.RELEASE, str(REPO / "k8s"), "--namespace", namespace,
           "--kubeconfig", str(plane.kubeconfig)]  # fmt: skip
    for path in values_files:
        cmd += ["-f", str(path)]
    started = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"demo-cluster: helm install failed: {proc.stderr.strip()}")
    say(f"helm install {demo.RELEASE}: accepted by the API server in {time.monotonic() - started:.1f} s")


def helm_test(plane: ControlPlane, namespace: str) -> bool:
    """`helm test` of the release's run-summary pod (the node check needs nvidia-smi: left out here): the
    real helm creates the hook pod, the kubelet runs it, helm reads its phase and log through the API."""
    pod = f"{cs_fullname(demo.RELEASE)}-test-run"
    cmd = [str(HELM), "test", demo.RELEASE, "--namespace", namespace, "--kubeconfig", str(plane.kubeconfig),
           "--filter", f"name={pod}", "--timeout", "5m", "--logs"]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    summary = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RUN_SUMMARY ")), "")
    verdict = "passed" if proc.returncode == 0 else f"FAILED ({(proc.stderr.strip() or 'no output')[-300:]})"
    say(f"helm test {demo.RELEASE} (pod {pod}): {verdict}; its RUN_SUMMARY line: {len(summary)} characters")
    return proc.returncode == 0


def cluster_values(out: Path) -> Path:
    """What this machine needs on top of the demo's values (see the module doc)."""
    path = out / "values-cluster.yaml"
    path.write_text(
        yaml.safe_dump({"rdzvPort": free_port(), "extraTrainerArgs": [f"--snapshot-dir={SHM_SNAPSHOTS}"]})
    )
    return path


# -- following the Job -----------------------------------------------------------------------------
def trainer_job(batch: client.BatchV1Api, namespace: str) -> client.V1Job:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        jobs = batch.list_namespaced_job(
            namespace, label_selector="app.kubernetes.io/component=trainer"
        ).items
        if jobs:
            return jobs[0]
        time.sleep(0.2)
    raise SystemExit("demo-cluster: the release created no trainer Job")


def job_state(job: client.V1Job) -> str | None:
    for condition in job.status.conditions or []:
        if condition.status == "True" and condition.type in ("Complete", "Failed"):
            return str(condition.type)
    return None


def env_of(job: client.V1Job, name: str) -> str:
    trainer = next(c for c in job.spec.template.spec.containers if c.name == "trainer")
    return next(str(e.value) for e in trainer.env if e.name == name)


def lost_nodes(pods: list[client.V1Pod]) -> set[str]:
    """Nodes whose trainer pod was killed whole (exit 137: the node-loss fault)."""
    nodes = set()
    for pod in pods:
        for status in pod.status.container_statuses or []:
            term = status.state.terminated if status.state else None
            if status.name == "trainer" and term is not None and term.exit_code == NODE_LOSS_EXIT:
                nodes.add(pod.spec.node_name)
    return nodes


def follow(
    kubelet: ProcessKubelet, api: client.ApiClient, namespace: str, run_dir: Path, total_steps: int,
    timeout_s: float,
) -> tuple[bool, list[dict[str, Any]]]:  # fmt: skip
    """Print the run's progress until the Job ends; lose the node of a pod killed whole. Returns whether
    the Job completed and what happened to its pods (name, index, node, phase, exit code, start)."""
    core, batch = client.CoreV1Api(api), client.BatchV1Api(api)
    job = trainer_job(batch, namespace)
    selector = f"job-name={job.metadata.name}"
    progress = demo.Progress(run_dir, total_steps)
    seen: dict[str, str] = {}
    lost: set[str] = set()
    deadline = time.monotonic() + timeout_s
    state = None
    while state is None and time.monotonic() < deadline:
        pods = core.list_namespaced_pod(namespace, label_selector=selector).items
        for pod in pods:
            key = f"{pod.status.phase}@{pod.spec.node_name}"
            if seen.get(pod.metadata.name) != key:
                seen[pod.metadata.name] = key
                say(
                    f"  pod {pod.metadata.name} (index {_index(pod)}): {pod.status.phase} "
                    f"on {pod.spec.node_name}"
                )
        for node in lost_nodes(pods) - lost:
            lost.add(node)
            kubelet.lose_node(node)
            say(f"  node {node} lost with its pod: NotReady; the Job controller replaces the pod elsewhere")
        if run_dir.is_dir():
            progress.update()
        state = job_state(batch.read_namespaced_job(job.metadata.name, namespace))
        time.sleep(0.5)
    if run_dir.is_dir():
        progress.update()
    say(f"job {job.metadata.name}: {state or f'timed out after {timeout_s:.0f} s'}")
    pods = core.list_namespaced_pod(namespace, label_selector=selector).items
    return state == "Complete", [_pod_record(p) for p in pods]


def _index(pod: client.V1Pod) -> str:
    return (pod.metadata.annotations or {}).get("batch.kubernetes.io/job-completion-index", "?")


def _pod_record(pod: client.V1Pod) -> dict[str, Any]:
    trainer = next((s for s in pod.status.container_statuses or [] if s.name == "trainer"), None)
    term = trainer.state.terminated if trainer and trainer.state else None
    return {
        "name": pod.metadata.name,
        "index": _index(pod),
        "node": pod.spec.node_name,
        "phase": pod.status.phase,
        "exit_code": term.exit_code if term else None,
        "created": pod.metadata.creation_timestamp.timestamp(),
        "finished": term.finished_at.timestamp() if term and term.finished_at else None,
        "conditions": sorted(c.type for c in pod.status.conditions or [] if c.status == "True"),
    }


def replacements(pods: list[dict[str, Any]]) -> list[str]:
    """For each index with more than one pod: when the real Job controller created the next pod after
    the one before ended (both API timestamps, whole seconds)."""
    lines = []
    by_index: dict[str, list[dict[str, Any]]] = {}
    for pod in sorted(pods, key=lambda p: p["created"]):
        by_index.setdefault(pod["index"], []).append(pod)
    for index, attempts in sorted(by_index.items()):
        for before, after in itertools.pairwise(attempts):
            if before["finished"] is not None:
                lines.append(
                    f"index {index}: {before['name']} ended {before['phase']} (exit {before['exit_code']}) "
                    f"on {before['node']}; the Job controller created {after['name']} "
                    f"{after['created'] - before['finished']:.0f} s later, on {after['node']}"
                )
    return lines


def collect_logs(api: client.ApiClient, namespace: str, pods: list[dict[str, Any]], out: Path) -> Path:
    """Each index's trainer logs, its pods in creation order, as `pod-<index>.log` (what tools/demo.py's
    report reads), through the API server's pods/log."""
    core = client.CoreV1Api(api)
    logs = out / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    for pod in sorted(pods, key=lambda p: p["created"]):
        try:
            text = core.read_namespaced_pod_log(pod["name"], namespace, container="trainer")
        except client.exceptions.ApiException as exc:
            text = f"(no log: {exc.status} {exc.reason})\n"
        with (logs / f"pod-{pod['index']}.log").open("a") as fh:
            fh.write(str(text))
    return logs


# -- the run -----------------------------------------------------------------------------------------
@contextmanager
def cluster(
    out: Path, values: dict[str, Any], pods: int, gpus: int
) -> Iterator[tuple[ControlPlane, ProcessKubelet]]:
    nvme = (values.get("storage") or {}).get("localNvmePath", "/mnt/nvme")
    instance = values.get("instanceType", "p5.48xlarge")
    # One node per pod and one free node for a replacement; each advertises the GPUs one pod asks for, so
    # the scheduler puts one pod on each, as a p5 pod taking all 8 GPUs does on the real node group.
    nodes = [gpu_node(f"gpu-node-{i}", instance, gpus=gpus, host_dirs=(nvme,)) for i in range(pods + 1)]
    nodes.append(system_node("system-node-0"))
    started = time.monotonic()
    with running_control_plane(out / "controlplane") as plane:
        say(f"control plane up in {time.monotonic() - started:.1f} s ({plane.server})")
        with ProcessKubelet(plane.kubeconfig, nodes, out / "nodes", storage_root=out / "storage") as kubelet:
            say(f"process kubelet: {len(nodes)} nodes registered ({', '.join(n.name for n in nodes)})")
            yield plane, kubelet


def run(teams: Path, overrides: Path, out: Path, timeout_s: float) -> int:
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    team = demo.default_team(teams)
    say(f"1/5 synthesize the environment of team '{team['name']}' ({teams})")
    release = demo.synthesize(teams, team, out)
    namespace = str(release.get("Namespace", "default"))
    say("2/5 render the chart with the synthesized values + " + str(overrides))
    pod = demo.render(release, overrides, out)  # the same rendering checks as the stand-in demo
    values_path = out / "values-synthesized.json"
    merged = {**release["Values"], **(yaml.safe_load(overrides.read_text()) or {})}
    npods = int(pod.trainer.env.get("MAX_NNODES", pod.trainer.env["NNODES"]))
    nproc = int(pod.trainer.env["NPROC_PER_NODE"])
    say("3/5 start the control plane and the process kubelet")
    with cluster(out, merged, npods, nproc) as (plane, kubelet):
        api = config.new_client_from_config(str(plane.kubeconfig))
        prepare_namespace(client.CoreV1Api(api), merged, namespace)
        say(f"4/5 helm install {demo.RELEASE} into namespace {namespace}; the real Job controller runs it")
        helm_install(plane, namespace, [values_path, overrides, cluster_values(out)])
        job = trainer_job(client.BatchV1Api(api), namespace)
        mount = (merged.get("storage") or {}).get("mountPath") or "/fsx"
        run_dir = (
            out / "storage" / FSX_VOLUME_PATH.strip("/") / Path(env_of(job, "OUT_DIR")).relative_to(mount)
        )
        job_ok, pods = follow(
            kubelet, api, namespace, run_dir, int(demo._flag(pod.trainer.argv, "--steps")), timeout_s
        )
        (out / "pods.json").write_text(json.dumps(pods, indent=2) + "\n")
        for line in replacements(pods):
            say(line)
        collect_logs(api, namespace, pods, out)
        tested = job_ok and helm_test(plane, namespace)
    say("5/5 report")
    result = demo.report(run_dir, out, job_ok, nproc)
    faults_ok = bool(result["faults"]) and all(f["recovered"] for f in result["faults"])
    return 0 if job_ok and faults_ok and tested else 1


# -- side by side ------------------------------------------------------------------------------------
def figures(report: dict[str, Any]) -> dict[str, str]:
    out = {
        "job succeeded": str(report["job_succeeded"]),
        "steps kept / recomputed": f"{report['steps']} / {report['steps_recomputed']}",
        "wall": f"{report['wall_s']:.1f} s",
        "training efficiency": f"{report['training_efficiency']:.1%}",
    }
    for fault in report["faults"]:
        name = f"{fault['type']}@{fault['step']} back to training"
        out[name] = "n/a" if fault["mttr_s"] is None else f"{fault['mttr_s']:.2f} s"
        took = fault.get("takeover")
        if took and took.get("pod"):
            out[f"{fault['type']}@{fault['step']} spare joined after"] = f"{took['joined_after_s']:.2f} s"
    return out


def compare(stand_in: Path, real: Path) -> str:
    a = figures(json.loads((stand_in / "report.json").read_text()))
    b = figures(json.loads((real / "report.json").read_text()))
    rows = [("", "stand-in (tools/localjob.py)", "real control plane")]
    rows += [(k, a.get(k, "-"), b.get(k, "-")) for k in dict.fromkeys([*a, *b])]
    width = max(len(r[0]) for r in rows)
    return "\n".join(f"{r[0]:<{width}}  {r[1]:<28}  {r[2]}" for r in rows)


def control_plane_built() -> bool:
    """Whether the four control-plane binaries are here (`make controlplane`, or `make test`, built them)."""
    try:
        binaries()
    except ControlPlaneError:
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.demo_cluster", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--teams", type=Path, default=REPO / "teams.yaml", help="teams file (first = default)"
    )
    parser.add_argument("--values", type=Path, default=REPO / "tools/demo-values.yaml", help="demo values")
    parser.add_argument("--out", type=Path, default=REPO / "out/demo-cluster", help="output directory")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds before the run is abandoned")
    parser.add_argument("--compare", action="store_true", help="run the stand-in demo first, then compare")
    parser.add_argument(
        "--stand-in-unless-built",
        action="store_true",
        help="`make demo`: run on the real control plane when `make controlplane` has built it, else the "
        "stand-in demo (tools/demo.py), which says so",
    )
    args = parser.parse_args(argv)
    if args.stand_in_unless_built and not control_plane_built():
        return demo.main(["--teams", str(args.teams), "--values", str(args.values)])
    # A SIGTERM (a CI timeout, kill) unwinds like Ctrl-C: the kubelet's pods and the control plane stop.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    stand_in_rc = None
    if args.compare:
        stand_in_out = args.out.parent / "demo"
        say(f"the stand-in demo first (tools/demo.py -> {stand_in_out})")
        stand_in_rc = demo.main(
            ["--teams", str(args.teams), "--values", str(args.values), "--out", str(stand_in_out)]
        )
    rc = run(args.teams.resolve(), args.values.resolve(), args.out.resolve(), args.timeout)
    if args.compare:
        table = compare(args.out.parent / "demo", args.out)
        (args.out / "compare.txt").write_text(table + "\n")
        print("\n" + table, flush=True)
        rc = rc or (stand_in_rc or 0)
    return rc


if __name__ == "__main__":
    sys.exit(main())
