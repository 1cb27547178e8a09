"""What a cluster smoke run trains and how its result is judged: the smoke plan, the chart values of the
smoke release (the environment's Contract 1 values plus a short faulted run), and the verdict read from
the run summary. No cluster access here (tools/cluster_smoke.py drives the cluster)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from trainer.components import chart_values

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
