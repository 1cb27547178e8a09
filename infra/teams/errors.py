"""The one error a bad teams file raises, and how a pydantic error becomes its one line."""

from __future__ import annotations

import math
from typing import Any

from pydantic import ValidationError


class TeamsConfigError(Exception):
    """An invalid teams file; `str()` is one line naming the file or `teams[i].field`. `loc` is the
    field's path when one is known (the loader adds the file's line of it)."""

    def __init__(self, message: str, loc: tuple[str | int, ...] = ()) -> None:
        super().__init__(message)
        self.loc = loc


class FieldError(ValueError):
    """A cross-field check's failure, carrying the path (relative to the model that raised it)."""

    def __init__(self, path: tuple[str | int, ...], message: str) -> None:
        super().__init__(message)
        self.path = path
        self.message = message


# What a strict field expected, by pydantic error type: `min_nodes: true` is refused, not read as 1.
_EXPECTED = {
    "int_type": "an integer",
    "bool_type": "true or false",
    "string_type": "a string",
    "list_type": "a list",
    "model_type": "a mapping",
    "model_attributes_type": "a mapping",
    "dict_type": "a mapping",
    "float_type": "a number",
}


def format_loc(loc: tuple[str | int, ...]) -> str:
    """`("teams", 1, "fsx", "storage_gib")` -> `teams[1].fsx.storage_gib`."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "teams file"


def describe(value: Any) -> str:
    """A value as the user wrote it in YAML (true, not True; strings quoted), shortened."""
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif value is None:
        text = "null"
    elif isinstance(value, dict):
        text = "a mapping"
    elif isinstance(value, list):
        text = "a list"
    elif isinstance(value, float) and not math.isfinite(value):
        text = ".nan" if math.isnan(value) else (".inf" if value > 0 else "-.inf")
    else:
        text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def one_line(exc: ValidationError) -> str:
    """The first error of `exc` as `teams[i].field: message`, counting the others."""
    return located(exc)[1]


def located(exc: ValidationError) -> tuple[tuple[str | int, ...], str]:
    """(the path of the first error of `exc`, its one line)."""
    errors = exc.errors()
    err = errors[0]
    loc = tuple(err["loc"])
    cause = (err.get("ctx") or {}).get("error")
    if isinstance(cause, FieldError):
        loc, message = loc + cause.path, cause.message
    elif err["type"] == "extra_forbidden":
        message = "unknown key"
    elif err["type"] == "missing":
        message = "required field is missing"
    elif err["type"] == "finite_number":
        message = f"must be a finite number, got {describe(err.get('input'))}"
    elif err["type"] in _EXPECTED:
        message = f"must be {_EXPECTED[err['type']]}, got {describe(err.get('input'))}"
    else:
        message = err["msg"].removeprefix("Value error, ")
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return loc, f"{format_loc(loc)}: {message}{more}".replace("\n", "\\n")
