"""The team's FSx for Lustre file system and its optional S3 link."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, field_validator, model_validator

from infra.inputs import path_segments_problem
from infra.teams.aws_rules import MAX_FSX_FILE_SYSTEM_PATH, s3_path_problem
from infra.teams.base import StrictModel
from infra.teams.errors import FieldError

PERSISTENT_2_THROUGHPUTS = (125, 250, 500, 1000)


class FsxConfig(StrictModel):
    """FSx for Lustre PERSISTENT_2 (Lustre 2.15, LZ4, KMS) for checkpoints and data."""

    storage_gib: Annotated[int, Field(ge=1200, le=2_400_000)] = 1200
    throughput_per_tib: int = 250
    """MB/s per TiB of storage; PERSISTENT_2 SSD accepts 125, 250, 500 or 1000."""
    s3_path: str | None = None
    """Optional `s3://bucket/prefix` linked by a data repository association (import + export)."""
    s3_file_system_path: str = "/"
    """Where the S3 prefix appears in the file system; `/` links the whole file system."""

    @field_validator("storage_gib")
    @classmethod
    def _capacity_step(cls, value: int) -> int:
        # AWS rejects any other size for PERSISTENT_2 SSD file systems.
        if value != 1200 and value % 2400 != 0:
            raise ValueError(f"PERSISTENT_2 needs 1200 or a multiple of 2400 (got {value})")
        return value

    @field_validator("throughput_per_tib")
    @classmethod
    def _throughput(cls, value: int) -> int:
        if value not in PERSISTENT_2_THROUGHPUTS:
            allowed = ", ".join(map(str, PERSISTENT_2_THROUGHPUTS))
            raise ValueError(f"PERSISTENT_2 throughput per TiB must be one of {allowed} (got {value})")
        return value

    @field_validator("s3_path")
    @classmethod
    def _s3_path(cls, value: str | None) -> str | None:
        if value is not None and (problem := s3_path_problem(value)):
            raise ValueError(problem)
        return value

    @field_validator("s3_file_system_path")
    @classmethod
    def _fs_path(cls, value: str) -> str:
        if not value.startswith("/") or any(c.isspace() for c in value):
            raise ValueError(f"{value!r} must be an absolute path inside the file system, e.g. /export")
        if problem := path_segments_problem(value, leading_slash=True):  # `..` would leave the file system
            raise ValueError(problem)
        if len(value) > MAX_FSX_FILE_SYSTEM_PATH:
            raise ValueError(f"{len(value)} characters is more than FSx accepts ({MAX_FSX_FILE_SYSTEM_PATH})")
        return value

    @model_validator(mode="after")
    def _fs_path_needs_s3(self) -> FsxConfig:
        if "s3_file_system_path" in self.model_fields_set and self.s3_path is None:
            raise FieldError(("s3_file_system_path",), "has no effect without s3_path (nothing is linked)")
        return self
