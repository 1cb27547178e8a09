"""The base of every teams-file model: unknown keys refused, immutable, strict types."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    # strict: YAML `true` is not the integer 1, `2400.0` is not an integer, `"yes"` is not a boolean.
    # No .inf or .nan: every number of the file is a size, count or time that must be finite.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)
