"""The team's checkpoint cadence (`checkpoints:`), checked against its file system by the sizing model.

The section is declared once, in sizing/teamfile.py (`Checkpoints`: fields, defaults, bounds, the rules
between fields), shared with the planner and the smoke run; this module wraps that declaration for the
teams file's pydantic models and turns a team's section into the sizing's inputs.
"""

from __future__ import annotations

import dataclasses
import math
import re
from typing import TYPE_CHECKING, Annotated, Any, get_type_hints

from pydantic import Field, create_model, model_validator

from infra.teams.base import StrictModel
from infra.teams.chart_bounds import chart_default
from infra.teams.errors import FieldError
from sizing import teamfile
from sizing.model import SizingInputs


def _field(f: dataclasses.Field[Any], hint: Any) -> tuple[Any, Any]:
    """One field of the sizing's declaration as pydantic's: its type, bounds (metadata) and default."""
    bounds = {k: v for k, v in f.metadata.items() if k in ("ge", "gt", "le")}
    return (Annotated[hint, Field(**bounds)] if bounds else hint), f.default


class _Declared(StrictModel):
    @model_validator(mode="after")
    def _one_of_each(self) -> _Declared:
        try:
            self.declared()
        except teamfile.TeamSizingError as err:  # the rules between fields, from the declaration
            raise FieldError((err.field,) if err.field else (), str(err).partition(": ")[2]) from None
        return self

    def declared(self) -> teamfile.Checkpoints:
        """The same section as the sizing's dataclass (its defaults filled in)."""
        return teamfile.Checkpoints(**self.model_dump())

    @property
    def preset(self) -> str | None:
        return self.declared().preset

    @property
    def steps_between_saves(self) -> int:
        return self.declared().steps_between_saves

    def as_mapping(self) -> dict[str, object]:
        """The fields as written (unset ones left out), for the sizing's own reader."""
        return self.model_dump(exclude_unset=True)


if TYPE_CHECKING:
    TeamCheckpoints = _Declared
else:
    _HINTS = get_type_hints(teamfile.Checkpoints)
    TeamCheckpoints = create_model(
        "TeamCheckpoints",
        __base__=_Declared,
        __doc__="The teams file's `checkpoints:` (sizing/teamfile.py Checkpoints), strict.",
        **{f.name: _field(f, _HINTS[f.name]) for f in dataclasses.fields(teamfile.Checkpoints)},
    )
"""sizing/teamfile.py `Checkpoints` under pydantic: strict types, its bounds and defaults, its rules
between fields, and errors located in the file (`teams[0].checkpoints.keep`, with the line)."""


def sizing_inputs(
    checkpoints: _Declared,
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


def checkpoint_values(checkpoints: _Declared, write_s: float) -> dict[str, object]:
    """The chart values of the checkpoint cadence (Contract 1), so the chart runs what was sized: the
    preset (left at the chart's when the team gives its own parameter count), ckptInterval, ckptKeep, and
    a ckptWriteTimeout of at least twice the sized write time (a save the file system needs 20 minutes
    for must not count as failed at the chart's 10)."""
    values: dict[str, object] = {
        "ckptInterval": checkpoints.steps_between_saves,
        "ckptKeep": checkpoints.declared().keep,
        # Never below the chart's default (the trainer setting's, generated into values.yaml).
        "ckptWriteTimeout": max(int(chart_default("ckptWriteTimeout")), math.ceil(2 * write_s)),
    }
    if checkpoints.preset is not None:
        values["preset"] = checkpoints.preset
    return values
