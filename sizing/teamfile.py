"""The teams file's sizing fields (`checkpoints:` of a team), their defaults, and the sizing inputs of a team
read from already-parsed YAML (the planner and the smoke run read the file themselves; infra validates it
with pydantic and builds the same inputs through `inputs_for`).

    checkpoints:
      model: 8b                 # a trainer preset (tiny, small, 1b, 8b, 70b), or
      parameters: 13000000000   # the team's own parameter count (then no preset reaches the chart)
      weights_dtype: fp32       # fp32 (the trainer's) or bf16 (adds an fp32 master copy with AdamW)
      optimizer: adamw          # adamw (two fp32 moments) or none
      interval_minutes: 30      # or interval_steps: N (not both)
      step_seconds: 2.0         # the team's measured seconds per step
      keep: 3                   # ckptKeep
      reload_budget_minutes: 15 # a whole-job reload slower than this gets a warning
      node_mbps: 2000           # each node's FSx client rate (NVMe drain, reload share)
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from sizing.model import DEFAULT_NODE_MBPS, SizingInputs
from sizing.models import checkpoint_bytes, parameters_of_preset

DEFAULT_MODEL = "8b"  # the chart's default preset
DEFAULT_INTERVAL_MINUTES = 30.0
# An assumption when the team gives none: the chart's 8b preset on p5 nodes steps in about a second;
# two leaves room. The team's measured figure (summary.json, the planner's fit) replaces it.
DEFAULT_STEP_SECONDS = 2.0
DEFAULT_KEEP = 3  # the chart's ckptKeep
DEFAULT_RELOAD_BUDGET_MINUTES = 15.0
# The teams file's defaults for a missing `fsx` section or node group (infra/teams: FsxConfig,
# GpuNodeGroupConfig), copied so the planner reads a team file as infra does.
DEFAULT_FSX_GIB = 1200
DEFAULT_THROUGHPUT_PER_TIB = 250
DEFAULT_INSTANCE_TYPE = "p5.48xlarge"
DEFAULT_NODES = 2

INSTANCE_TYPES_FILE = Path(__file__).resolve().parent.parent / "k8s" / "instance-types.json"
FIELDS = (
    "model",
    "parameters",
    "weights_dtype",
    "optimizer",
    "interval_minutes",
    "interval_steps",
    "step_seconds",
    "keep",
    "reload_budget_minutes",
    "node_mbps",
)


class TeamSizingError(ValueError):
    """A team's sizing fields cannot be read; `str()` is one line naming the field."""


def interval_steps(minutes: float, step_seconds: float) -> int:
    """Steps between saves for an interval in minutes (never longer than asked)."""
    return max(1, math.floor(minutes * 60 / step_seconds))


def instance_facts(instance_type: str) -> dict[str, int]:
    """GPUs and NVMe of an instance type (k8s/instance-types.json, the table infra and the chart read)."""
    types = json.loads(INSTANCE_TYPES_FILE.read_text(encoding="utf-8"))["types"]
    if instance_type not in types:
        raise TeamSizingError(
            f"gpu_node_group.instance_type: {instance_type!r} is not one of {sorted(types)}"
        )
    return dict(types[instance_type])


def inputs_for(
    checkpoints: Mapping[str, Any],
    *,
    nodes: int,
    gpus_per_node: int,
    fsx_gib: int,
    throughput_per_tib: int,
    nvme_gib_per_node: float | None,
) -> SizingInputs:
    """The sizing inputs of a `checkpoints:` mapping (defaults filled) on the given nodes and file system."""
    c = dict(checkpoints)
    unknown = sorted(set(c) - set(FIELDS))
    if unknown:
        raise TeamSizingError(f"checkpoints.{unknown[0]}: unknown key")
    if "interval_minutes" in c and "interval_steps" in c:
        raise TeamSizingError("checkpoints.interval_steps: give interval_minutes or interval_steps, not both")
    if "model" in c and "parameters" in c:
        raise TeamSizingError("checkpoints.parameters: give model (a preset) or parameters, not both")
    try:
        params = (
            int(c["parameters"]) if "parameters" in c else parameters_of_preset(c.get("model", DEFAULT_MODEL))
        )
        ckpt = checkpoint_bytes(params, c.get("weights_dtype", "fp32"), c.get("optimizer", "adamw"))
    except (TypeError, ValueError) as err:
        raise TeamSizingError(f"checkpoints: {err}") from None
    step_s = float(c.get("step_seconds", DEFAULT_STEP_SECONDS))
    steps = (
        int(c["interval_steps"])
        if "interval_steps" in c
        else interval_steps(float(c.get("interval_minutes", DEFAULT_INTERVAL_MINUTES)), step_s)
    )
    try:
        return SizingInputs(
            checkpoint_bytes=ckpt,
            nodes=nodes,
            gpus_per_node=gpus_per_node,
            fsx_gib=fsx_gib,
            throughput_per_tib=throughput_per_tib,
            interval_s=steps * step_s,
            keep=int(c.get("keep", DEFAULT_KEEP)),
            step_s=step_s,
            node_mbps=float(c.get("node_mbps", DEFAULT_NODE_MBPS)),
            nvme_gib_per_node=nvme_gib_per_node,
            reload_budget_s=60 * float(c.get("reload_budget_minutes", DEFAULT_RELOAD_BUDGET_MINUTES)),
        )
    except ValueError as err:
        raise TeamSizingError(f"checkpoints: {err}") from None


def find_team(data: Any, name: str | None) -> Mapping[str, Any]:
    """The team called `name` in parsed teams-file data (the first team when `name` is None)."""
    teams = data.get("teams") if isinstance(data, Mapping) else None
    if not isinstance(teams, list) or not teams or not all(isinstance(t, Mapping) for t in teams):
        raise TeamSizingError("teams: expected a mapping with a non-empty 'teams' list of mappings")
    if name is None:
        return teams[0]
    for team in teams:
        if team.get("name") == name:
            return team
    names = ", ".join(str(t.get("name")) for t in teams)
    raise TeamSizingError(f"team={name}: no such team (teams: {names})")


def team_inputs(team: Mapping[str, Any]) -> SizingInputs:
    """The sizing inputs of one team mapping of a teams file, as infra reads it (training nodes only)."""
    group = team.get("gpu_node_group") or {}
    fsx = team.get("fsx") or {}
    facts = instance_facts(str(group.get("instance_type", DEFAULT_INSTANCE_TYPE)))
    return inputs_for(
        team.get("checkpoints") or {},
        nodes=int(group.get("desired_nodes", DEFAULT_NODES)),
        gpus_per_node=int(facts["gpus"]),
        fsx_gib=int(fsx.get("storage_gib", DEFAULT_FSX_GIB)),
        throughput_per_tib=int(fsx.get("throughput_per_tib", DEFAULT_THROUGHPUT_PER_TIB)),
        nvme_gib_per_node=float(facts["nvmeDevices"] * facts["nvmeGibEach"]),
    )
