"""One declaration per setting: a dataclass field carries its flag, doc, bounds and chart value.

Every trainer component declares its settings as fields of a frozen dataclass made with `setting(...)`:

    interval_steps: int = setting("--ckpt-interval", "save every N steps", default=10, low=1,
                                  chart="ckptInterval")

From that one line `add_arguments` makes the command-line option (type, default, help), `build` reads
the parsed options back into the dataclass, `check` enforces the bounds with an error that names the
option (`ckpt_interval: must be >= 1, got 0`), and `chart_rows` lists which Helm chart value renders the
option. Stdlib only: `--check-config` and the harnesses import this without torch.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import MISSING, Field, dataclass, field, fields, is_dataclass
from typing import Any

from trainer.config.errors import UnrecoverableError, error_line

WEEK_S = 604800
"""The longest timeout any setting accepts, in seconds (the chart's schema gets the same bound, generated)."""
EXACT_INT = 2**53 - 1
"""The largest integer Helm keeps exact (it holds numbers as float64): the bound of seeds."""


class ConfigError(UnrecoverableError, ValueError):
    """An invalid configuration value; str() is `config error: <field>: why`, always one line.

    An UnrecoverableError, so one raised after start-up is never retried either (trainer/config/errors.py).
    """

    def __init__(self, field_name: str, why: str) -> None:
        super().__init__(field_name, why)
        self.args = (error_line(self),)


@dataclass(frozen=True)
class Spec:
    """What `setting` records in a field's metadata (under the key "setting")."""

    flag: str | None
    """The command-line option; None for a value derived from other settings (no option)."""
    doc: str
    """One line: the option's help text."""
    kind: type | None = None
    """int, float, str, Path or bool (a --x/--no-x switch); None: the field's default's type."""
    low: float | None = None
    """Smallest allowed value (inclusive)."""
    above: float | None = None
    """Values must be strictly greater than this."""
    high: float | None = None
    """Largest allowed value (inclusive)."""
    choices: tuple[str, ...] | None = None
    pattern: str | None = None
    """A string value must match this regular expression whole (re.fullmatch)."""
    max_length: int | None = None
    """Longest allowed string value."""
    unit: str = ""
    """Appended to the bound in errors (" seconds")."""
    note: str = ""
    """Appended to the bound in errors (" (0 = off)")."""
    why: str | None = None
    """An error text of its own for a bound, formatted with {value!r}/{value} (kept from older lines)."""
    chart: str | None = None
    """The Helm chart value (k8s/values.yaml) rendered as this option, if any."""
    place: str | None = None
    """The pod env entry (Contract 2 of docs/design.md) the chart renders as this option, if any."""
    required: bool = False
    repeat: bool = False
    """A repeatable option collected into a list (the field's converter turns it into the value)."""
    metavar: str | None = None


def setting(
    flag: str | None,
    doc: str,
    *,
    default: Any = MISSING,
    factory: Callable[[], Any] | None = None,
    **spec: Any,
) -> Any:
    """A dataclass field declared once: its option, help, default, bounds and chart value."""
    meta = {"setting": Spec(flag=flag, doc=doc, **spec)}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def spec_of(f: Field[Any]) -> Spec | None:
    value = f.metadata.get("setting")
    return value if isinstance(value, Spec) else None


def option_name(flag: str) -> str:
    """`--ckpt-interval` -> `ckpt_interval`: how errors and argparse name an option."""
    return flag.lstrip("-").replace("-", "_")


def error_name(cls: type, name: str) -> str:
    """The name an error gives a field: its option's (interval_steps -> ckpt_interval), else its own."""
    for f in fields(cls):
        spec = spec_of(f)
        if f.name == name and spec is not None and spec.flag:
            return option_name(spec.flag)
    return name


def _kind(f: Field[Any], spec: Spec) -> type:
    if spec.kind is not None:
        return spec.kind
    if f.default is not MISSING and f.default is not None:
        return type(f.default)
    raise TypeError(f"setting {f.name}: give kind= (no default to take the type from)")


def declared(cls: type) -> Iterator[tuple[Field[Any], Spec]]:
    """The fields of `cls` made with `setting`, in declaration order."""
    for f in fields(cls):
        spec = spec_of(f)
        if spec is not None:
            yield f, spec


def dest(component: str, f: Field[Any]) -> str:
    return f"{component}__{f.name}"


def add_arguments(parser: argparse.ArgumentParser, component: str, cls: type) -> None:
    """One option per declared field of `cls` (fields without a flag are derived: no option)."""
    for f, spec in declared(cls):
        if spec.flag is None:
            continue
        kw: dict[str, Any] = {"dest": dest(component, f), "help": spec.doc}
        kind = list if spec.repeat else _kind(f, spec)
        if spec.repeat:
            kw.update(action="append", default=[])
        elif kind is bool:
            kw.update(action=argparse.BooleanOptionalAction, default=f.default)
        else:
            kw["type"] = kind
            if spec.required:
                kw["required"] = True
            else:
                # A field built from other options (e.g. ckpt.dir from --out-dir) has no default here.
                kw["default"] = None if f.default is MISSING else f.default
        if spec.choices is not None:
            kw["choices"] = spec.choices
        if spec.metavar is not None:
            kw["metavar"] = spec.metavar
        elif kind is not bool and spec.choices is None and not spec.repeat:
            kw["metavar"] = option_name(spec.flag).upper()
        parser.add_argument(spec.flag, **kw)


def parsed(args: argparse.Namespace, component: str, cls: type) -> dict[str, Any]:
    """The parsed values of the options of `cls`, by field name (what `add_arguments` added)."""
    return {f.name: getattr(args, dest(component, f)) for f, spec in declared(cls) if spec.flag is not None}


def check(obj: Any) -> None:
    """Raise ConfigError naming the option of the first declared field outside its bounds."""
    for f, spec in declared(type(obj)):
        value = getattr(obj, f.name)
        name = option_name(spec.flag) if spec.flag else f.name
        why = _violation(spec, value, _kind(f, spec) if not spec.repeat else list)
        if why is not None:
            raise ConfigError(
                name, spec.why.format(value=value) if spec.why and not _too_big(spec, value) else why
            )


def _too_big(spec: Spec, value: Any) -> bool:
    """Past the upper bound: reported as such, not with a `why` written for the lower bound."""
    number = isinstance(value, int | float) and not isinstance(value, bool)
    return number and spec.high is not None and value > spec.high


def _violation(spec: Spec, value: Any, kind: type) -> str | None:
    if kind is int and value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        return spec.why.format(value=value) if spec.why else f"must be an integer, got {value!r}"
    if spec.choices is not None and value not in spec.choices:
        return f"must be one of {', '.join(spec.choices)}, got {value!r}"
    if spec.pattern is not None or spec.max_length is not None:
        return _string_violation(spec, value)
    bounded = spec.low is not None or spec.above is not None or spec.high is not None
    if not bounded or value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"must be a number, got {value!r}"
    if isinstance(value, float) and not math.isfinite(value):
        return f"must be a finite number, got {value}"
    if spec.low is not None and value < spec.low:
        return f"must be >= {_num(spec.low)}{spec.unit}{spec.note}, got {value}"
    if spec.above is not None and not value > spec.above:
        return f"must be > {_num(spec.above)}{spec.unit}{spec.note}, got {value}"
    if spec.high is not None and value > spec.high:
        if spec.low is not None:
            return f"must be in [{_num(spec.low)}, {_num(spec.high)}], got {value}"
        return f"must be <= {_num(spec.high)}{spec.unit}, got {value}"
    return None


def _string_violation(spec: Spec, value: Any) -> str | None:
    if not isinstance(value, str):
        return f"must be a string, got {value!r:.80}"
    if spec.max_length is not None and len(value) > spec.max_length:
        return f"must be at most {spec.max_length} characters, got {len(value)}"
    if spec.pattern is not None and not re.fullmatch(spec.pattern, value):
        return f"must match {spec.pattern}, got {value!r:.80}"
    return None


def _num(bound: float) -> str:
    return str(int(bound)) if float(bound).is_integer() else str(bound)


@dataclass(frozen=True)
class ChartRow:
    """One line of the chart-to-trainer table: chart value -> trainer option -> config field."""

    value: str
    """The key in k8s/values.yaml (or the pod env entry, for `place` rows: `$(DATA_PATH)`)."""
    flag: str
    field: str
    """`<component>.<field>` in TrainConfig, e.g. ckpt.interval_steps."""
    kind: type
    is_place: bool = False


def chart_rows(components: dict[str, type]) -> list[ChartRow]:
    """Every option the chart renders, from the declarations (`chart=` or `place=`)."""
    rows = []
    for component, cls in components.items():
        assert is_dataclass(cls)
        for f, spec in declared(cls):
            if spec.flag is None:
                continue
            kind = _kind(f, spec) if not spec.repeat else list
            if spec.chart:
                rows.append(ChartRow(spec.chart, spec.flag, f"{component}.{f.name}", kind))
            if spec.place:
                rows.append(ChartRow(spec.place, spec.flag, f"{component}.{f.name}", kind, is_place=True))
    return rows


__all__ = [
    "EXACT_INT",
    "WEEK_S",
    "ChartRow",
    "ConfigError",
    "Spec",
    "add_arguments",
    "chart_rows",
    "check",
    "declared",
    "error_name",
    "option_name",
    "parsed",
    "setting",
]
