"""One reading of every plain YAML scalar: the teams file refuses any scalar YAML 1.1 and YAML 1.2 read
differently, naming the field, its line and column. Here, beside the sizing's reading of the teams file,
so that every reader of that file (infra's teams check, the goodput planner, the cluster smoke run) refuses
the same scalars; the one module of this package that needs PyYAML, which each of those readers has.

PyYAML reads YAML 1.1 (a `%YAML 1.2` directive changes nothing): `010` is 8, `1:30` is 90, `1_000` is
1000, `yes`/`on` are true, `2001-12-14` a date, while `1e3` and `0o17` stay strings. Helm, Go, kubectl
and most current tools read YAML 1.2's core schema, where those are 10, a string, a string, strings,
a string, 1000.0 and 15. A value that means one thing to the teams check and another to the next reader
(or to the user who wrote it) is refused here, before any field is validated: the user quotes it for a
string or writes the number in the one form both read alike.
"""

from __future__ import annotations

import math
import re
from typing import Any

import yaml

# YAML 1.2 core schema (https://yaml.org/spec/1.2.2/#1023-core-schema).
_CORE_NULL = re.compile(r"~|null|Null|NULL|", re.ASCII)
_CORE_BOOL = re.compile(r"true|True|TRUE|false|False|FALSE", re.ASCII)
_CORE_INT10 = re.compile(r"[-+]?[0-9]+", re.ASCII)
_CORE_INT8 = re.compile(r"0o[0-7]+", re.ASCII)
_CORE_INT16 = re.compile(r"0x[0-9a-fA-F]+", re.ASCII)
_CORE_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?", re.ASCII)
_CORE_INF = re.compile(r"[-+]?\.(inf|Inf|INF)", re.ASCII)
_CORE_NAN = re.compile(r"\.(nan|NaN|NAN)", re.ASCII)
# YAML 1.1 booleans PyYAML leaves strings but the 1.1 spec (and Go's yaml.v2, which Helm used) reads as
# booleans: refused too, so no reader of the file can take `n` for false.
_YAML11_SHORT_BOOL = re.compile(r"y|Y|n|N", re.ASCII)

_RESOLVER = yaml.resolver.Resolver()
_CONSTRUCTOR = yaml.constructor.SafeConstructor()


def core_reading(text: str) -> tuple[str, Any]:
    """(kind, value) of a plain scalar under the YAML 1.2 core schema."""
    if _CORE_NULL.fullmatch(text):
        return "null", None
    if _CORE_BOOL.fullmatch(text):
        return "bool", text.lower() == "true"
    if _CORE_INT10.fullmatch(text):
        return "int", int(text, 10)
    if _CORE_INT8.fullmatch(text):
        return "int", int(text[2:], 8)
    if _CORE_INT16.fullmatch(text):
        return "int", int(text[2:], 16)
    if _CORE_FLOAT.fullmatch(text):
        return "float", float(text)
    if _CORE_INF.fullmatch(text):
        return "float", -math.inf if text.startswith("-") else math.inf
    if _CORE_NAN.fullmatch(text):
        return "float", math.nan
    return "str", text


def yaml11_reading(text: str) -> tuple[str, Any]:
    """(kind, value) of a plain scalar as PyYAML's SafeLoader (YAML 1.1) reads it."""
    if _YAML11_SHORT_BOOL.fullmatch(text):
        return "bool", text in "yY"
    tag = _RESOLVER.resolve(yaml.ScalarNode, text, (True, False))
    kind = tag.rsplit(":", 1)[-1]
    if kind in ("int", "float", "bool", "null", "timestamp"):
        try:
            return kind, _CONSTRUCTOR.construct_object(yaml.ScalarNode(tag, text))
        except (ValueError, yaml.YAMLError):  # e.g. a timestamp of day 31 of February
            return kind, text
    return "str", text


def _same(a: tuple[str, Any], b: tuple[str, Any]) -> bool:
    if a[0] != b[0]:
        return False
    if a[0] == "float" and math.isnan(a[1]) and math.isnan(b[1]):
        return True
    return bool(a[1] == b[1])


def _shown(reading: tuple[str, Any]) -> str:
    kind, value = reading
    if kind == "str":
        return "a string"
    if kind == "bool":
        return "true" if value else "false"
    if kind == "timestamp":
        return f"the date {value}"
    if kind == "null":
        return "null"
    return f"the {'integer' if kind == 'int' else 'number'} {value!r}"


def reading_problem(text: str) -> str | None:
    """Why a plain scalar is ambiguous between YAML 1.1 and 1.2, or None when both read it alike."""
    old, new = yaml11_reading(text), core_reading(text)
    if _same(old, new):
        return None
    if "bool" in (old[0], new[0]):
        hint = "write true or false, or quote it for a string"
    elif new[0] == "int":
        hint = f"write {new[1]} (no leading zeros or prefixes), or quote it for a string"
    elif old[0] == "timestamp":
        hint = "quote it (no field takes a date)"
    elif old[0] in ("int", "float") and new[0] == "str":
        hint = "write a plain decimal number (no _ or :), or quote it for a string"
    else:
        hint = "write it in plain decimal form (e.g. 1000.0), or quote it for a string"
    return f"{text} is {_shown(old)} in YAML 1.1 but {_shown(new)} in YAML 1.2; {hint}"


def _format_path(path: list[str | int]) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "teams file"


def load_unambiguous(text: str) -> Any:
    """`text` read with PyYAML's safe loader, after refusing (ValueError: `field: why (line L, column C)`)
    any plain scalar YAML 1.1 and 1.2 read differently: what infra's teams check refuses, for the readers
    of the teams file that do not import infra."""
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    if ambiguous := first_ambiguous_scalar(text, loader):
        field, line, column, problem = ambiguous
        raise ValueError(f"{field}: {problem} (line {line}, column {column})")
    return yaml.load(text, Loader=loader)


def first_ambiguous_scalar(text: str, loader: Any) -> tuple[str, int, int, str] | None:
    """(field path as written, line, column, why) of the first plain scalar (key or value) YAML 1.1 and
    1.2 read differently, else None. Walks the event stream once: the path is tracked from the mapping
    keys and sequence indexes met on the way."""
    path: list[str | int] = []
    # One frame per open collection: ["map", expecting_key] or ["seq", next_index].
    frames: list[list[Any]] = []

    def enter_value() -> None:
        """A node starts: push where it sits onto `path`."""
        if not frames:
            return
        frame = frames[-1]
        if frame[0] == "seq":
            path.append(frame[1])
            frame[1] += 1

    def leave_value() -> None:
        if not frames:
            return
        frame = frames[-1]
        if path:
            path.pop()
        if frame[0] == "map":
            frame[1] = True

    for event in yaml.parse(text, Loader=loader):
        is_key = bool(frames) and frames[-1][0] == "map" and frames[-1][1]
        if isinstance(event, yaml.ScalarEvent | yaml.AliasEvent):
            plain = isinstance(event, yaml.ScalarEvent) and not event.style and event.tag is None
            if plain and (problem := reading_problem(event.value)):
                line, column = event.start_mark.line + 1, event.start_mark.column + 1
                if is_key:
                    return _format_path([*path, event.value]), line, column, "key " + problem
                return _format_path(path), line, column, problem
            if is_key:
                key = event.value if isinstance(event, yaml.ScalarEvent) else "<<"
                path.append(key)
                frames[-1][1] = False
            else:
                enter_value()
                leave_value()
        elif isinstance(event, yaml.CollectionStartEvent):
            if is_key:  # a complex key: its own frame; the value after it has no name to show
                path.append("?")
                frames[-1][1] = False
            else:
                enter_value()
            frames.append(["map", True] if isinstance(event, yaml.MappingStartEvent) else ["seq", 0])
        elif isinstance(event, yaml.CollectionEndEvent):
            frames.pop()
            leave_value()
    return None
