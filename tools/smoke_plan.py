"""What a cluster smoke run trains and how its result is judged: the smoke plan, the chart values of the
smoke release (the environment's Contract 1 values plus a short faulted run), and the verdict read from
the run summary. No cluster access here (tools/cluster_smoke.py drives the cluster)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from trainer.reference.config import chart_values

SUMMARY_MARKER = "RUN_SUMMARY "

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
        chart_values(
            {
                "model.preset": plan.preset,
                "data.seq_len": plan.seq_len,
                "data.micro_batch_size": plan.micro_batch_size,
                "run.steps": plan.steps,
                "ckpt.interval_steps": plan.ckpt_interval,
                "ckpt.keep_latest": 2,
                "faults.specs": {
                    # Tier 1: a Python exception on one rank; the in-process Wrapper restarts every rank.
                    "soft": f"exception:step={plan.soft_fault_step}:rank=1",
                    # Tier 2: a rank process dies; ft_launcher restarts the workers. The last rank lives
                    # on the last pod, so with several nodes the restart crosses pods.
                    "hard": f"sigkill:step={plan.hard_fault_step}:rank={world - 1}",
                },
            }
        )
    )
    values.update(
        {
            "runName": run_name,
            "dataPath": plan.data_path,
            "syntheticTokens": plan.synthetic_tokens,
            # A smoke run that hangs should not hold GPU nodes for long.
            "activeDeadlineSeconds": 3600,
        }
    )
    return values


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


# -- the storage step ----------------------------------------------------------------------------
PROBE_MARKER = '{"probe": "storage"'
# Below this share of what the sizing model expects, the storage step fails the smoke run.
DEFAULT_STORAGE_FRACTION = 0.5
# The probe writes at most this much per file whatever the shard size (bounded in bytes), and stops
# every phase at the time limit (bounded in time).
DEFAULT_PROBE_CAP_BYTES = 8 * 10**9
DEFAULT_PROBE_TIME_LIMIT_S = 300.0
PROBE_MOUNT = "/fsx"


@dataclass(frozen=True)
class StorageExpectation:
    """What the sizing model expects of the storage step (from the team's sizing)."""

    nodes: int
    files_per_node: int
    """Files each pod writes in parallel: its ranks' shards."""
    bytes_per_file: int
    """One rank's checkpoint shard (capped)."""
    aggregate_mbps: float
    """The durable rate the sizing assumed: min(FSx baseline, nodes x node_mbps)."""
    fsx_mbps: float
    fraction: float = DEFAULT_STORAGE_FRACTION

    def __post_init__(self) -> None:
        if not 0 < self.fraction <= 1:
            raise SmokeError(f"--storage-fraction must be in (0, 1], got {self.fraction}")
        if self.nodes < 1 or self.files_per_node < 1 or self.bytes_per_file < 1:
            raise SmokeError("the storage step needs nodes, files per node and bytes per file >= 1")

    @property
    def per_node_mbps(self) -> float:
        return self.aggregate_mbps / self.nodes


def storage_expectation(
    sizing: Any,
    fraction: float = DEFAULT_STORAGE_FRACTION,
    cap_bytes: int = DEFAULT_PROBE_CAP_BYTES,
    nodes: int | None = None,
) -> StorageExpectation:
    """The storage step's expectation from a `sizing.SizingResult` (optionally on fewer nodes)."""
    i = sizing.inputs
    count = nodes or i.nodes
    aggregate = min(sizing.fsx_mbps, count * i.node_mbps)
    return StorageExpectation(
        nodes=count,
        files_per_node=i.gpus_per_node,
        bytes_per_file=min(sizing.shard_bytes_per_rank, cap_bytes),
        aggregate_mbps=aggregate,
        fsx_mbps=sizing.fsx_mbps,
        fraction=fraction,
    )


def probe_args(
    exp: StorageExpectation, directory: str, time_limit_s: float, start_at: float | None
) -> list[str]:
    """The probe's command line in every pod (or local process)."""
    args = [
        "python", "-m", "trainer.checkpoint.storage_probe",
        f"--dir={directory}",
        f"--bytes={exp.bytes_per_file}",
        f"--files={exp.files_per_node}",
        f"--time-limit={time_limit_s:g}",
        f"--expect-mbps={exp.per_node_mbps:.3f}",
    ]  # fmt: skip
    if start_at is not None:
        args.append(f"--start-at={start_at:.3f}")
    return args


def probe_job(
    base: dict[str, Any],
    exp: StorageExpectation,
    job_name: str,
    release: str,
    run_name: str,
    time_limit_s: float,
    start_at: float,
) -> dict[str, Any]:
    """The storage step's Job: one probe pod per GPU node, all at once, on the team's FSx claim."""
    labels = {"app.kubernetes.io/instance": release, "app.kubernetes.io/component": "trainer"}
    image = base["image"]
    storage = base.get("storage") or {}
    directory = f"{PROBE_MOUNT}/smoke/storage/{run_name}/$(JOB_COMPLETION_INDEX)"
    pod_spec = {
        "restartPolicy": "Never",
        "serviceAccountName": base.get("serviceAccountName", "trainer"),
        "nodeSelector": {
            "blueprint.nvrx/node-role": "gpu",
            **({"node.kubernetes.io/instance-type": base["instanceType"]} if "instanceType" in base else {}),
        },
        "tolerations": [
            {"key": "nvidia.com/gpu", "operator": "Equal", "value": "true", "effect": "NoSchedule"}
        ],
        # One probe per node: the figure is per node's client, as a checkpoint's writers are.
        "affinity": {
            "podAntiAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": [
                    {"labelSelector": {"matchLabels": labels}, "topologyKey": "kubernetes.io/hostname"}
                ]
            }
        },
        # As the trainer's pods by default (k8s/values.yaml runAsNonRoot): root without capabilities, since
        # the FSx root directory is root's and the CSI driver applies no fsGroup to a static volume.
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [
            {
                "name": "probe",
                "image": f"{image['repository']}:{image.get('tag') or 'latest'}",
                "command": probe_args(exp, directory, time_limit_s, start_at),
                "env": [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
                "volumeMounts": [{"name": "fsx", "mountPath": PROBE_MOUNT}],
                "resources": {"requests": {"cpu": "2", "memory": "1Gi"}, "limits": {"memory": "2Gi"}},
                "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                    "capabilities": {"drop": ["ALL"]}},
            }
        ],
        "volumes": [
            {"name": "fsx", "persistentVolumeClaim": {"claimName": storage.get("claimName", "fsx-shared")}}
        ],
    }  # fmt: skip
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": job_name, "labels": labels},
        "spec": {
            "completionMode": "Indexed",
            "completions": exp.nodes,
            "parallelism": exp.nodes,
            "backoffLimit": 0,
            "activeDeadlineSeconds": int(time_limit_s) + 900,  # the image pull and scheduling on top
            "ttlSecondsAfterFinished": 3600,
            "template": {"metadata": {"labels": labels}, "spec": pod_spec},
        },
    }


def parse_probe_lines(text: str) -> list[dict[str, Any]]:
    """The probe's JSON lines in a log (other lines ignored)."""
    return [json.loads(ln) for ln in text.splitlines() if ln.startswith(PROBE_MARKER)]


def evaluate_storage(results: list[dict[str, Any]], exp: StorageExpectation) -> Verdict:
    """Measured against expected: per node, and the aggregate (all bytes over the slowest node's time)."""
    lines = [
        f"storage: expected {exp.aggregate_mbps:,.0f} MB/s together ({exp.per_node_mbps:,.0f} MB/s per node, "
        f"FSx baseline {exp.fsx_mbps:,.0f} MB/s); fail below {exp.fraction:.0%}"
    ]
    problems = []
    floor = exp.fraction * exp.per_node_mbps
    for r in sorted(results, key=lambda r: str(r.get("node"))):
        lines.append(
            f"storage node {r['node']}: write {r['write_mbps']:,.1f} MB/s, read {r['read_mbps']:,.1f} MB/s "
            f"({r['files']} x {r['bytes_per_file'] / 1e6:,.0f} MB, cache {r['cache']}"
            f"{', time-limited' if r.get('time_limited') else ''}), expected {exp.per_node_mbps:,.1f} MB/s"
        )
        for phase in ("write", "read"):
            if r[f"{phase}_mbps"] < floor:
                problems.append(
                    f"node {r['node']} {phase}s {r[f'{phase}_mbps']:,.1f} MB/s, below {exp.fraction:.0%} of "
                    f"the expected {exp.per_node_mbps:,.1f} MB/s"
                )
    if len(results) < exp.nodes:
        problems.append(f"{len(results)} of {exp.nodes} nodes reported a storage measurement")
    if results:
        aggregate = {}
        for phase in ("write", "read"):
            moved = sum(r[f"bytes_{'written' if phase == 'write' else 'read'}"] for r in results)
            slowest = max(r[f"{phase}_s"] for r in results)
            aggregate[phase] = moved / 1e6 / slowest if slowest > 0 else 0.0
        lines.append(
            f"storage aggregate of {len(results)} nodes: write {aggregate['write']:,.1f} MB/s, read "
            f"{aggregate['read']:,.1f} MB/s, expected {exp.aggregate_mbps:,.1f} MB/s"
        )
        for phase, mbps in aggregate.items():
            if mbps < exp.fraction * exp.aggregate_mbps:
                problems.append(
                    f"aggregate {phase} {mbps:,.1f} MB/s is below {exp.fraction:.0%} of the expected "
                    f"{exp.aggregate_mbps:,.1f} MB/s"
                )
    lines.extend(f"FAIL: storage: {p}" for p in problems)
    lines.append("PASS: storage keeps up with the sizing" if not problems else "storage step FAILED")
    return Verdict(ok=not problems, lines=lines)
