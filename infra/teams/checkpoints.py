"""The team's checkpoint cadence (`checkpoints:`), checked against its file system by the sizing model.

The defaults and the arithmetic are the `sizing` package's (shared with the planner and the smoke run);
this module types the fields and turns the team's sections into the sizing's inputs.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Literal

from pydantic import Field, model_validator

from infra.teams.base import StrictModel
from infra.teams.errors import FieldError
from sizing import teamfile
from sizing.model import DEFAULT_NODE_MBPS, SizingInputs
from sizing.models import PRESET_SHAPES

Preset = Literal["tiny", "small", "1b", "8b", "70b"]
assert set(Preset.__args__) == set(PRESET_SHAPES)  # type: ignore[attr-defined]


class CheckpointConfig(StrictModel):
    """What the storage sizing needs; docs/infra.md, "Storage sized for the checkpoint cadence"."""

    model: Preset | None = None
    """The trainer preset (chart `preset`); default 8b unless `parameters` is given."""
    parameters: Annotated[int, Field(ge=1, le=10**14)] | None = None
    """The team's own parameter count, instead of a preset (no preset reaches the chart then)."""
    weights_dtype: Literal["fp32", "bf16"] = "fp32"
    optimizer: Literal["adamw", "none"] = "adamw"
    interval_minutes: Annotated[float, Field(gt=0, le=7 * 24 * 60)] | None = None
    """Minutes between checkpoints (default 30); or `interval_steps`."""
    interval_steps: Annotated[int, Field(ge=1)] | None = None
    """Steps between checkpoints (chart `ckptInterval`); or `interval_minutes`."""
    # At least a millisecond: no training step is faster, and a step of 1e-300 s would make the sizing's
    # rates infinite (the chart's ckptInterval bound would refuse its interval in steps too).
    step_seconds: Annotated[float, Field(ge=1e-3, le=3600)] = teamfile.DEFAULT_STEP_SECONDS
    keep: Annotated[int, Field(ge=1, le=100)] = teamfile.DEFAULT_KEEP
    """Committed checkpoints kept (chart `ckptKeep`)."""
    reload_budget_minutes: Annotated[float, Field(gt=0, le=7 * 24 * 60)] = (
        teamfile.DEFAULT_RELOAD_BUDGET_MINUTES
    )
    node_mbps: Annotated[float, Field(ge=1, le=1e6)] = DEFAULT_NODE_MBPS
    """Each node's FSx client rate, MB/s (the NVMe drain and its share of a reload)."""

    @model_validator(mode="after")
    def _one_of_each(self) -> CheckpointConfig:
        if self.model is not None and self.parameters is not None:
            raise FieldError(("parameters",), "give model (a trainer preset) or parameters, not both")
        if self.interval_minutes is not None and self.interval_steps is not None:
            raise FieldError(("interval_steps",), "give interval_minutes or interval_steps, not both")
        return self

    @property
    def preset(self) -> str | None:
        """The chart's `preset`: the model, the default preset, or None for a team's own parameter count."""
        if self.parameters is not None:
            return None
        return self.model or teamfile.DEFAULT_MODEL

    @property
    def steps_between_saves(self) -> int:
        """The chart's `ckptInterval`."""
        if self.interval_steps is not None:
            return self.interval_steps
        minutes = self.interval_minutes or teamfile.DEFAULT_INTERVAL_MINUTES
        return teamfile.interval_steps(minutes, self.step_seconds)

    def as_mapping(self) -> dict[str, object]:
        """The fields as written (unset ones left out), for the sizing's own reader."""
        return self.model_dump(exclude_unset=True)


def sizing_inputs(
    checkpoints: CheckpointConfig,
    *,
    nodes: int,
    gpus_per_node: int,
    fsx_gib: int,
    throughput_per_tib: int,
    nvme_gib_per_node: float,
) -> SizingInputs:
    """The sizing inputs of a validated team (the planner builds the same from the raw file)."""
    try:
        return teamfile.inputs_for(
            checkpoints.as_mapping(),
            nodes=nodes,
            gpus_per_node=gpus_per_node,
            fsx_gib=fsx_gib,
            throughput_per_tib=throughput_per_tib,
            nvme_gib_per_node=nvme_gib_per_node,
        )
    except teamfile.TeamSizingError as err:  # typed, bounded fields make this unreachable; keep it one line
        raise FieldError(("checkpoints",), as_written(str(err).removeprefix("checkpoints: "))) from None


# The sizing model's own names of the teams file's fields, for a message that would name one.
_AS_WRITTEN = {
    "reload_budget_s": "reload_budget_minutes",
    "interval_s": "interval_minutes (or interval_steps x step_seconds)",
    "step_s": "step_seconds",
    "checkpoint_bytes": "model or parameters",
}


def as_written(message: str) -> str:
    """`message` with the sizing model's field names replaced by the teams file's."""
    for internal, written in _AS_WRITTEN.items():
        message = re.sub(rf"\b{internal}\b", written, message)
    return message


# The chart's ckptWriteTimeout default (k8s/values.yaml): never set below it.
CHART_WRITE_TIMEOUT_S = 600


def checkpoint_values(checkpoints: CheckpointConfig, write_s: float) -> dict[str, object]:
    """The chart values of the checkpoint cadence (Contract 1), so the chart runs what was sized: the
    preset (left at the chart's when the team gives its own parameter count), ckptInterval, ckptKeep, and
    a ckptWriteTimeout of at least twice the sized write time (a save the file system needs 20 minutes
    for must not count as failed at the chart's 10)."""
    values: dict[str, object] = {
        "ckptInterval": checkpoints.steps_between_saves,
        "ckptKeep": checkpoints.keep,
        "ckptWriteTimeout": max(CHART_WRITE_TIMEOUT_S, math.ceil(2 * write_s)),
    }
    if checkpoints.preset is not None:
        values["preset"] = checkpoints.preset
    return values
