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
import operator
from collections.abc import Mapping
from dataclasses import Field, dataclass, field, fields
from pathlib import Path
from types import UnionType
from typing import Any, Literal, Union, get_args, get_origin, get_type_hints

from sizing.model import DEFAULT_NODE_MBPS, SizingInputs
from sizing.models import PRESET_SHAPES, checkpoint_bytes, parameters_of_preset

DEFAULT_MODEL = "8b"  # the chart's default preset (trainer/reference/config.py)
DEFAULT_INTERVAL_MINUTES = 30.0
# The teams file's defaults for a missing `fsx` section or node group (infra/teams: FsxConfig,
# GpuNodeGroupConfig), copied so the planner reads a team file as infra does.
DEFAULT_FSX_GIB = 1200
DEFAULT_THROUGHPUT_PER_TIB = 250
DEFAULT_INSTANCE_TYPE = "p5.48xlarge"
DEFAULT_NODES = 2

INSTANCE_TYPES_FILE = Path(__file__).resolve().parent.parent / "k8s" / "instance-types.json"
WEEK_MINUTES = 7 * 24 * 60


class TeamSizingError(ValueError):
    """A team's sizing fields cannot be read; `str()` is one line naming the field (`checkpoints.keep: ...`).
    `field` is the field's name within `checkpoints:` when one is to blame."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


Preset = Literal["tiny", "small", "1b", "8b", "70b"]
assert set(get_args(Preset)) == set(PRESET_SHAPES)


def _bounded(default: Any, **bounds: float) -> Any:
    """A field with its bounds (ge, gt, le) in its metadata: checked here, and by infra's pydantic wrap."""
    return field(default=default, metadata=bounds)


@dataclass(frozen=True)
class Checkpoints:
    """A team's `checkpoints:` section: the one declaration of its fields, defaults and bounds.

    infra/teams/checkpoints.py wraps it for the teams file's pydantic models (strict types, line numbers);
    the planner and the smoke run read a parsed file through `from_mapping`.
    """

    model: Preset | None = None
    """A trainer preset (chart `preset`); default DEFAULT_MODEL unless `parameters` is given."""
    parameters: int | None = _bounded(None, ge=1, le=10**14)
    """The team's own parameter count, instead of a preset (no preset reaches the chart then)."""
    weights_dtype: Literal["fp32", "bf16"] = "fp32"
    """fp32 (the trainer's) or bf16 (adds an fp32 master copy with AdamW)."""
    optimizer: Literal["adamw", "none"] = "adamw"
    """adamw (two fp32 moments) or none."""
    interval_minutes: float | None = _bounded(None, gt=0, le=WEEK_MINUTES)
    """Minutes between checkpoints (default DEFAULT_INTERVAL_MINUTES); or `interval_steps`."""
    interval_steps: int | None = _bounded(None, ge=1)
    """Steps between checkpoints (chart `ckptInterval`); or `interval_minutes`."""
    # At least a millisecond: no training step is faster, and a step of 1e-300 s would make the sizing's
    # rates infinite. The default is an assumption when the team gives none: the chart's 8b preset on p5
    # nodes steps in about a second; two leaves room. The planner's fit of summary.json replaces it.
    step_seconds: float = _bounded(2.0, ge=1e-3, le=3600)
    """The team's measured seconds per step."""
    keep: int = _bounded(3, ge=1, le=100)
    """Committed checkpoints kept (chart `ckptKeep`)."""
    reload_budget_minutes: float = _bounded(15.0, gt=0, le=WEEK_MINUTES)
    """A whole-job reload slower than this gets a warning."""
    node_mbps: float = _bounded(DEFAULT_NODE_MBPS, ge=1, le=1e6)
    """Each node's FSx client rate, MB/s (the NVMe drain and its share of a reload)."""

    def __post_init__(self) -> None:
        for f in fields(self):
            _check_bounds(f, getattr(self, f.name))
        if self.model is not None and self.parameters is not None:
            raise TeamSizingError(
                "checkpoints.parameters: give model (a trainer preset) or parameters, not both", "parameters"
            )
        if self.interval_minutes is not None and self.interval_steps is not None:
            raise TeamSizingError(
                "checkpoints.interval_steps: give interval_minutes or interval_steps, not both",
                "interval_steps",
            )

    @classmethod
    def from_mapping(cls, section: Mapping[str, Any]) -> Checkpoints:
        """From parsed YAML: unknown keys, types and bounds refused naming `checkpoints.<field>`."""
        hints = get_type_hints(cls)
        known = {f.name for f in fields(cls)}
        for name, value in section.items():
            if name not in known:
                raise TeamSizingError(f"checkpoints.{name}: unknown key", str(name))
            if not _is_a(value, hints[name]):
                raise TeamSizingError(
                    f"checkpoints.{name}: must be {_expected(hints[name])}, got {value!r}", name
                )
        return cls(**section)

    @property
    def preset(self) -> str | None:
        """The chart's `preset`: the model, the default preset, or None for a team's own parameter count."""
        if self.parameters is not None:
            return None
        return self.model or DEFAULT_MODEL

    @property
    def steps_between_saves(self) -> int:
        """The chart's `ckptInterval`."""
        if self.interval_steps is not None:
            return self.interval_steps
        return interval_steps(self.interval_minutes or DEFAULT_INTERVAL_MINUTES, self.step_seconds)


def _check_bounds(f: Field[Any], value: Any) -> None:
    if value is None or not f.metadata:
        return
    if not math.isfinite(value):
        raise TeamSizingError(f"checkpoints.{f.name}: must be a finite number, got {value}", f.name)
    for bound, holds, text in (
        ("ge", operator.ge, ">="),
        ("gt", operator.gt, ">"),
        ("le", operator.le, "<="),
    ):
        limit = f.metadata.get(bound)
        if limit is not None and not holds(value, limit):
            raise TeamSizingError(f"checkpoints.{f.name}: must be {text} {limit:g}, got {value:g}", f.name)


def _options(hint: Any) -> tuple[Any, ...]:
    return get_args(hint) if get_origin(hint) in (Union, UnionType) else (hint,)


def _is_a(value: Any, hint: Any) -> bool:
    """`value` as YAML gives it fits `hint` (int, float, a Literal, or an Optional of one); no bools."""
    if isinstance(value, bool):
        return False
    for option in _options(hint):
        if option is type(None) and value is None:
            return True
        if get_origin(option) is Literal and value in get_args(option):
            return True
        if option is int and isinstance(value, int):
            return True
        if option is float and isinstance(value, int | float):
            return True
    return False


def _expected(hint: Any) -> str:
    options = [o for o in _options(hint) if o is not type(None)]
    if get_origin(options[0]) is Literal:
        return "one of " + ", ".join(map(str, get_args(options[0])))
    return "an integer" if options[0] is int else "a number"


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
    c = Checkpoints.from_mapping(checkpoints)
    try:
        params = c.parameters if c.parameters is not None else parameters_of_preset(c.model or DEFAULT_MODEL)
        ckpt = checkpoint_bytes(params, c.weights_dtype, c.optimizer)
        return SizingInputs(
            checkpoint_bytes=ckpt,
            nodes=nodes,
            gpus_per_node=gpus_per_node,
            fsx_gib=fsx_gib,
            throughput_per_tib=throughput_per_tib,
            interval_s=c.steps_between_saves * c.step_seconds,
            keep=c.keep,
            step_s=c.step_seconds,
            node_mbps=c.node_mbps,
            nvme_gib_per_node=nvme_gib_per_node,
            reload_budget_s=60 * c.reload_budget_minutes,
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
