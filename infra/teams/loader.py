"""Reading the teams file: bytes -> strict YAML -> plain strings -> validated `TeamConfig`s.

Each step refuses what would make the file mean something other than what was written: non-UTF-8 bytes,
a duplicate key (PyYAML would keep the last silently), a string with a line break, control character or
surrounding whitespace (a `|` block scalar keeps a trailing newline in a name, ARN or S3 path).
"""

from __future__ import annotations

import unicodedata
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from infra.inputs import InputError, check_yaml_events, read_teams_bytes
from infra.teams.errors import TeamsConfigError, describe, format_loc, located
from infra.teams.team import TeamConfig, TeamsFile
from sizing.yaml_readings import first_ambiguous_scalar

# libyaml's parser when PyYAML was built with it (several times faster), else the pure-Python one.
_SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _StrictLoader(_SafeLoader):  # type: ignore[misc, valid-type]
    """SafeLoader that refuses a key given twice in one mapping (merge keys `<<` still override)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, yaml.Mark] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                first = seen.setdefault(key, key_node.start_mark)
            except TypeError:  # an unhashable key (a list or mapping as key): let the constructor refuse it
                continue
            if first is not key_node.start_mark:
                raise yaml.constructor.ConstructorError(
                    None,
                    None,
                    f"duplicate key {describe(key)} (first at line {first.line + 1}; the second would "
                    "silently replace the first)",
                    key_node.start_mark,
                )
        return super().construct_mapping(node, deep=deep)


def _string_problem(value: str) -> str | None:
    if value != value.strip():
        edge = "a line break" if value.endswith(("\n", "\r")) else "whitespace"
        hint = "a `|` block scalar keeps a trailing newline; write the value on one line"
        return f"{describe(value)} starts or ends with {edge} ({hint})"
    for char in value:
        if unicodedata.category(char) in ("Cc", "Cf", "Zl", "Zp"):
            return f"{describe(value)} contains the control character U+{ord(char):04X}"
    return None


def _check_strings(data: Any, loc: tuple[str | int, ...] = (), above: frozenset[int] = frozenset()) -> None:
    """Refuse any string (key or value, at any depth) that does not read the same on one line."""
    if isinstance(data, dict | list):
        if id(data) in above:  # `&a [*a]`: an alias inside itself
            raise TeamsConfigError(f"{format_loc(loc)}: a YAML alias refers to a value that contains it")
        above = above | {id(data)}
    if isinstance(data, str):
        if problem := _string_problem(data):
            raise TeamsConfigError(f"{format_loc(loc)}: {problem}", loc)
    elif isinstance(data, dict):
        for key, value in data.items():
            if isinstance(key, str) and (problem := _string_problem(key)):
                raise TeamsConfigError(f"{format_loc(loc)}: key {problem}", loc)
            _check_strings(value, (*loc, key if isinstance(key, str) else describe(key)), above)
    elif isinstance(data, list):
        for i, item in enumerate(data):
            _check_strings(item, (*loc, i), above)


def parse_teams(data: Any, source: str = "teams file") -> list[TeamConfig]:
    """Validate already-parsed YAML data; raise `TeamsConfigError` (one line) on any bad value."""
    if not isinstance(data, dict) or "teams" not in data:
        raise TeamsConfigError(f"{source}: expected a mapping with a 'teams' list at the top level")
    _check_strings(data)
    try:
        return list(TeamsFile.model_validate(data).teams)
    except ValidationError as exc:
        loc, line = located(exc)
        raise TeamsConfigError(line, loc) from None


def line_of(text: str, loc: tuple[str | int, ...]) -> int | None:
    """The line (1-based) of the field at `loc` in the YAML `text`: the key's line for a mapping entry,
    the item's for a list entry; the deepest existing part of the path when the rest is missing."""
    try:
        node = yaml.compose(text, Loader=_SafeLoader)
    except yaml.YAMLError:
        return None
    line = None
    for part in loc:
        found = None
        if isinstance(node, yaml.MappingNode) and isinstance(part, str):
            found = next(((k, v) for k, v in node.value if k.value == part), None)
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
            item = node.value[part]
            found = (item, item)
        if found is None:
            break
        line = found[0].start_mark.line + 1
        node = found[1]
    return line


def _decode(path: Path, raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise TeamsConfigError(
            f"{path}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at line {line}); save the file as UTF-8"
        ) from None


def load_teams(path: str | Path) -> list[TeamConfig]:
    """Read and validate the teams file at `path`; raise `TeamsConfigError` (one line) on any problem."""
    path = Path(path)
    try:
        raw = read_teams_bytes(path)  # a regular file within the cap, through one descriptor
    except InputError as exc:
        raise TeamsConfigError(str(exc)) from None
    text = _decode(path, raw)
    try:
        check_yaml_events(text, _SafeLoader, str(path))  # alias bombs and huge numbers, before any walk
        if ambiguous := first_ambiguous_scalar(text, _SafeLoader):  # one reading: YAML 1.1 and 1.2 agree
            field, line, column, problem = ambiguous
            raise TeamsConfigError(f"{field}: {problem} (line {line}, column {column})")
        data = yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass
    except InputError as exc:
        raise TeamsConfigError(str(exc)) from None
    except yaml.reader.ReaderError as exc:  # a character YAML does not allow (NUL, most C0 controls)
        line = text[: exc.position].count("\n") + 1
        column = exc.position - (text.rfind("\n", 0, exc.position) + 1) + 1
        raise TeamsConfigError(
            f"{path}: invalid YAML at line {line}, column {column}: the character U+{exc.character:04X} "
            "is not allowed in YAML text"
        ) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or getattr(exc, "context", None) or str(exc)
        raise TeamsConfigError(f"{path}: invalid YAML{where}: {problem}".replace("\n", " ")) from None
    try:
        return parse_teams(data, str(path))
    except TeamsConfigError as exc:
        field_line = line_of(text, exc.loc) if exc.loc else None
        if field_line is None:
            raise
        raise TeamsConfigError(f"{exc} (line {field_line})", exc.loc) from None


def select_team(teams: list[TeamConfig], name: str | None) -> list[TeamConfig]:
    """All teams, or only the one called `name` (the `-c team=NAME` context)."""
    if not name:
        return teams
    chosen = [t for t in teams if t.name == name]
    if not chosen:
        raise TeamsConfigError(f"team={name}: no such team (teams: {', '.join(t.name for t in teams)})")
    return chosen
