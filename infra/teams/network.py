"""The team VPC as the teams file describes it."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, field_validator, model_validator

from infra.teams.aws_rules import vpc_cidr_problem
from infra.teams.base import StrictModel
from infra.teams.errors import FieldError


class NetworkConfig(StrictModel):
    """The team VPC: explicit AZs (synth never looks them up), the GPU subnet in one of them."""

    vpc_cidr: str = "10.0.0.0/16"
    availability_zones: Annotated[list[str], Field(min_length=2, max_length=6)]
    gpu_availability_zone: str
    """The AZ of the GPU subnet, the GPU nodes and FSx: p5 capacity lives in one AZ."""
    nat_gateways: Annotated[int, Field(ge=1, le=6)] = 1

    @field_validator("vpc_cidr")
    @classmethod
    def _cidr(cls, value: str) -> str:
        if problem := vpc_cidr_problem(value):
            raise ValueError(problem)
        return value

    @field_validator("availability_zones")
    @classmethod
    def _unique(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError("availability zones must be distinct")
        return value

    @model_validator(mode="after")
    def _gpu_az_in_vpc(self) -> NetworkConfig:
        if self.gpu_availability_zone not in self.availability_zones:
            raise FieldError(
                ("gpu_availability_zone",), f"{self.gpu_availability_zone} is not one of availability_zones"
            )
        if self.nat_gateways > len(self.availability_zones):
            raise FieldError(("nat_gateways",), "more NAT gateways than availability zones")
        return self
