"""The two managed node groups of a team: GPU (with its capacity source) and system."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from infra.instance_types import DEFAULT_GPU_INSTANCE_TYPE, GPU_INSTANCE_TYPES
from infra.teams.aws_rules import CAPACITY_ID, EC2_TYPE
from infra.teams.base import StrictModel
from infra.teams.errors import FieldError


class CapacityConfig(StrictModel):
    """Where the GPU nodes' capacity comes from."""

    type: Literal["on-demand", "reservation", "capacity-block"] = "on-demand"
    id: str | None = None
    """The `cr-...` id of the on-demand capacity reservation or capacity block; none for on-demand."""

    @model_validator(mode="after")
    def _id_matches_type(self) -> CapacityConfig:
        if self.type == "on-demand":
            if self.id is not None:
                raise FieldError(
                    ("id",), "on-demand capacity takes no id (use type reservation or capacity-block)"
                )
        elif self.id is None:
            raise FieldError(("id",), f"capacity type {self.type} needs the cr-... id")
        elif not CAPACITY_ID.fullmatch(self.id):
            raise FieldError(
                ("id",),
                f"{self.id!r} is not a capacity reservation or capacity block id "
                "(cr- followed by 8 or 17 hex digits)",
            )
        return self


def check_sizes(min_nodes: int, desired: int, max_nodes: int) -> None:
    if min_nodes > desired:
        raise FieldError(("desired_nodes",), f"desired_nodes {desired} is below min_nodes {min_nodes}")
    if desired > max_nodes:
        raise FieldError(("desired_nodes",), f"desired_nodes {desired} is above max_nodes {max_nodes}")


class GpuNodeGroupConfig(StrictModel):
    """The GPU managed node group (one AZ, one cluster placement group)."""

    instance_type: str = DEFAULT_GPU_INSTANCE_TYPE
    min_nodes: Annotated[int, Field(ge=0)] = 0
    desired_nodes: Annotated[int, Field(ge=1)] = 2
    max_nodes: Annotated[int, Field(ge=1, le=450)] = 2
    capacity: CapacityConfig = CapacityConfig()
    root_volume_gib: Annotated[int, Field(ge=100, le=16384)] = 500

    @field_validator("instance_type")
    @classmethod
    def _known_type(cls, value: str) -> str:
        if value not in GPU_INSTANCE_TYPES:
            raise ValueError(
                f"unknown GPU instance type {value!r} (allowed: {', '.join(GPU_INSTANCE_TYPES)})"
            )
        return value

    @model_validator(mode="after")
    def _sizes_ordered(self) -> GpuNodeGroupConfig:
        check_sizes(self.min_nodes, self.desired_nodes, self.max_nodes)
        return self

    @property
    def gpus_per_node(self) -> int:
        return GPU_INSTANCE_TYPES[self.instance_type].gpus


class SystemNodeGroupConfig(StrictModel):
    """The CPU managed node group for cluster add-ons (spread over all AZs)."""

    instance_type: str = "m6i.xlarge"
    min_nodes: Annotated[int, Field(ge=1)] = 2
    desired_nodes: Annotated[int, Field(ge=1)] = 2
    max_nodes: Annotated[int, Field(ge=1, le=450)] = 4

    @field_validator("instance_type")
    @classmethod
    def _ec2_type(cls, value: str) -> str:
        if not EC2_TYPE.fullmatch(value):
            raise ValueError(f"{value!r} is not an EC2 instance type (family.size, e.g. m6i.xlarge)")
        if value in GPU_INSTANCE_TYPES:
            raise ValueError(f"{value} is a GPU type; system nodes run add-ons only")
        return value

    @model_validator(mode="after")
    def _sizes_ordered(self) -> SystemNodeGroupConfig:
        check_sizes(self.min_nodes, self.desired_nodes, self.max_nodes)
        return self
