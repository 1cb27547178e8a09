"""Seeded mutations of the project's own valid inputs, for the generated tests of the teams file and the
chart values: each leaf gets wrong types, strings that break YAML or carry invisible characters,
boundaries around numbers, and keys removed or added. Deterministic for a given seed (no hypothesis
needed: the catalogue below is the search space, the seed picks the sample)."""

from __future__ import annotations

import copy
import json
import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

Path = tuple[str | int, ...]
DELETED = object()

STRING_EDITS: list[tuple[str, Callable[[str], str]]] = [
    ("trailing newline", lambda s: s + "\n"),
    ("leading space", lambda s: " " + s),
    ("trailing space", lambda s: s + " "),
    ("yaml comment", lambda s: s + " #prod"),
    ("yaml mapping", lambda s: s + ": x"),
    ("injected field", lambda s: s + "\n  hostNetwork: true"),
    ("double quote", lambda s: s + '"'),
    ("single quote", lambda s: "'" + s),
    ("template braces", lambda s: s + "{{ .Release.Name }}"),
    ("accented and CJK", lambda s: s + "\u00e9\u4e2d"),
    ("zero-width space", lambda s: s + "\u200b"),
    ("line separator", lambda s: s + "\u2028"),
    ("tab", lambda s: s[:1] + "\t" + s[1:]),
    ("uppercase", str.upper),
    ("empty", lambda s: ""),
    ("long", lambda s: (s or "a") * (300 // max(1, len(s)) + 1)),
    ("dot segments", lambda s: s + "/../x"),
    ("yaml true", lambda s: "true"),
    ("yaml null", lambda s: "null"),
    ("number-like", lambda s: "1e3"),
]

NUMBER_EDITS: list[tuple[str, Callable[[float], Any]]] = [
    ("plus one", lambda n: n + 1),
    ("minus one", lambda n: n - 1),
    ("zero", lambda n: 0),
    ("negative", lambda n: -abs(n) - 1),
    ("times 1000", lambda n: n * 1000),
    ("fraction", lambda n: n + 0.5),
    ("as string", lambda n: str(n)),
]

TYPE_SWAPS: list[tuple[str, Any]] = [
    ("true", True),
    ("false", False),
    ("null", None),
    ("huge int", 2**63),
    ("NaN", math.nan),
    ("Inf", math.inf),
    ("list", ["x"]),
    ("mapping", {"x": 1}),
    ("string", "x"),
]


@dataclass(frozen=True)
class Mutant:
    """One mutated input: what was done where, the whole mutated document, the value now at `path`."""

    label: str
    path: Path
    data: Any
    value: Any


def leaves(data: Any, path: Path = ()) -> Iterator[tuple[Path, Any]]:
    """Every scalar and every empty container under `data`, with its path."""
    if isinstance(data, dict) and data:
        for key, value in data.items():
            yield from leaves(value, (*path, key))
    elif isinstance(data, list) and data:
        for i, value in enumerate(data):
            yield from leaves(value, (*path, i))
    else:
        yield path, data


def replaced(data: Any, path: Path, value: Any) -> Any:
    """A deep copy of `data` with `value` at `path` (DELETED removes the key or item)."""
    out = copy.deepcopy(data)
    node = out
    for part in path[:-1]:
        node = node[part]
    if value is DELETED:
        del node[path[-1]]
    else:
        node[path[-1]] = copy.deepcopy(value)
    return out


def _edits(value: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(value, str):
        for label, edit in STRING_EDITS:
            yield label, edit(value)
    elif isinstance(value, bool):
        yield "bool as string", "true" if value else "false"
        yield "bool as int", int(value)
    elif isinstance(value, int | float):
        for label, edit in NUMBER_EDITS:
            yield label, edit(value)
    for label, swap in TYPE_SWAPS:
        if type(swap) is not type(value):
            yield label, swap


def mutants(data: Any, seed: int, count: int | None = None) -> list[Mutant]:
    """Mutants of `data`: every catalogue edit of every leaf, keys removed and added; `count` sampled."""
    found: list[Mutant] = []
    for path, value in leaves(data):
        if not path:
            continue
        for label, new in _edits(value):
            found.append(Mutant(label, path, replaced(data, path, new), new))
        found.append(Mutant("removed", path, replaced(data, path, DELETED), DELETED))
        parent = path[:-1]
        if isinstance(path[-1], str):
            found.append(
                Mutant("unknown key", (*parent, "unknownKey"), replaced(data, (*parent, "unknownKey"), 1), 1)
            )
    if count is not None and count < len(found):
        found = random.Random(seed).sample(found, count)
    return found


def to_yaml(value: Any) -> str:
    """YAML (JSON flow style) that every YAML 1.1 and 1.2 parser reads back as exactly `value`: strings
    double-quoted (so `N`, `yes` or `1e3` stay strings), NaN and infinities as .nan / .inf."""
    if isinstance(value, float) and math.isnan(value):
        return ".nan"
    if isinstance(value, float) and math.isinf(value):
        return ".inf" if value > 0 else "-.inf"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(str(k))}: {to_yaml(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(to_yaml(v) for v in value) + "]"
    return json.dumps(value)


def describe(mutant: Mutant) -> str:
    where = ".".join(str(p) for p in mutant.path)
    return f"{mutant.label} at {where}: {mutant.value!r}"[:200]
