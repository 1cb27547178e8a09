"""The trainer chart's own bounds (and defaults) on the values a team's config derives for it, read from
k8s/values.schema.json (not copied), so a value the teams check passes is never refused by the chart at
deploy time, after the stack has been built.

Only the keywords those properties use are understood (type, minimum, maximum, exclusiveMinimum, enum,
$ref); a property that grows another keyword fails loudly here instead of being half-checked.
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path
from typing import Any

import yaml

SCHEMA_FILE = Path(__file__).resolve().parents[2] / "k8s" / "values.schema.json"
VALUES_FILE = SCHEMA_FILE.with_name("values.yaml")
_UNDERSTOOD = {"type", "minimum", "maximum", "exclusiveMinimum", "enum", "description"}


@functools.cache
def _schema() -> dict[str, Any]:
    return dict(json.loads(SCHEMA_FILE.read_text(encoding="utf-8")))


@functools.cache
def _values() -> dict[str, Any]:
    return dict(yaml.safe_load(VALUES_FILE.read_text(encoding="utf-8")))


def chart_default(name: str) -> Any:
    """The chart's default of top-level value `name` (k8s/values.yaml), for values infra leaves to it."""
    return _values()[name]


def chart_property(name: str) -> dict[str, Any]:
    """The schema of top-level chart value `name`, its $ref resolved."""
    schema = _schema()
    prop = dict(schema["properties"][name])
    if "$ref" in prop:
        prop = dict(schema["definitions"][prop.pop("$ref").rsplit("/", 1)[1]])
    unknown = set(prop) - _UNDERSTOOD
    if unknown:
        raise AssertionError(f"values.schema.json {name}: keywords {sorted(unknown)} are not checked here")
    return prop


def chart_bound_problem(name: str, value: Any) -> str | None:
    """Why the chart would refuse `value` for its value `name` (None when it accepts it)."""
    prop = chart_property(name)
    kinds = prop.get("type")
    kinds = [kinds] if isinstance(kinds, str) else (kinds or [])
    is_number = isinstance(value, int | float) and not isinstance(value, bool)
    if is_number:
        if isinstance(value, float) and not math.isfinite(value):
            return f"{value} is not a finite number for the chart's {name}"
        if "minimum" in prop and value < prop["minimum"]:
            return f"{_shown(value)} is below the chart's minimum {name} of {_shown(prop['minimum'])}"
        if "exclusiveMinimum" in prop and value <= prop["exclusiveMinimum"]:
            bound = _shown(prop["exclusiveMinimum"])
            return f"{_shown(value)} is not above the chart's minimum {name} of {bound}"
        if "maximum" in prop and value > prop["maximum"]:
            return f"{_shown(value)} is above the chart's maximum {name} of {_shown(prop['maximum'])}"
    is_integer = isinstance(value, int) and not isinstance(value, bool)
    if "integer" in kinds and not is_integer and not ("number" in kinds and is_number):
        return f"the chart's {name} must be an integer (got {value!r})"
    if "number" in kinds and not is_number:
        return f"the chart's {name} must be a number (got {value!r})"
    if "enum" in prop and value not in prop["enum"]:
        return f"the chart's {name} must be one of {', '.join(map(str, prop['enum']))} (got {value!r})"
    return None


def _shown(value: float) -> str:
    """A number short enough for one line (a 304-digit integer as 1.8e+303), else as written."""
    if isinstance(value, int) and len(str(value)) <= 20:
        return str(value)
    return f"{value:.3g}" if abs(value) >= 1e15 else f"{value:g}"
