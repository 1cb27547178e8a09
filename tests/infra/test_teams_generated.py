"""Generated teams files: the checked-in teams.yaml and tests/infra/extra_teams.yaml, mutated leaf by leaf
(types, YAML-breaking and invisible characters, boundaries, keys removed and added) and line by line
(duplicate keys, block scalars, a non-UTF-8 byte). Each mutant is either refused by `load_teams` with one
line naming where, or accepted with every value exactly as written; never a traceback. A few accepted
mutants are synthesized, and their strings must appear in the template exactly."""

from __future__ import annotations

import json
import math
import os
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from infra.config import TeamConfig, TeamsConfigError, load_teams
from tests.helpers import REPO_ROOT
from tests.mutate import DELETED, Mutant, describe, mutants, to_yaml

HERE = Path(__file__).resolve().parent
SOURCES = {"teams.yaml": REPO_ROOT / "teams.yaml", "extra_teams.yaml": HERE / "extra_teams.yaml"}
SEED = 15
# Where a one-line error may point: `teams[i].field...`, the file itself, or `team=...`.
ONE_LINE = re.compile(r"^(teams(\[\d+\])?(\.[\w\[\]]+)*|/\S+|team=\S+|teams file): \S.*$")


def _outcome(path: Path) -> list[TeamConfig] | str:
    """The loaded teams, or the error line; any other exception fails the test with its traceback."""
    try:
        return load_teams(path)
    except TeamsConfigError as exc:
        message = str(exc)
        assert "\n" not in message and ONE_LINE.match(message), f"not a one-line error: {message!r}"
        return message


def _at(data: Any, path: tuple[str | int, ...]) -> Any:
    for part in path:
        data = data[part]
    return data


def _same(written: Any, loaded: Any) -> bool:
    """`loaded` is exactly `written`: same type (no bool-as-int, no int-as-float) and value."""
    if isinstance(written, float) and math.isnan(written):
        return isinstance(loaded, float) and math.isnan(loaded)
    if isinstance(written, dict):
        return isinstance(loaded, dict) and all(_same(v, loaded.get(k)) for k, v in written.items())
    if isinstance(written, list):
        return isinstance(loaded, list) and len(written) == len(loaded) and all(map(_same, written, loaded))
    return type(written) is type(loaded) and written == loaded


def _value_mutants() -> list[tuple[str, Mutant]]:
    out = []
    for name, source in SOURCES.items():
        data = yaml.safe_load(source.read_text(encoding="utf-8"))
        out += [(name, m) for m in mutants(data, seed=SEED)]
    return out


VALUE_MUTANTS = _value_mutants()


def test_value_mutants_are_refused_in_one_line_or_kept_exactly(tmp_path: Path) -> None:
    accepted = refused = 0
    for i, (source, mutant) in enumerate(VALUE_MUTANTS):
        path = tmp_path / f"{i}.yaml"
        path.write_text(to_yaml(mutant.data), encoding="utf-8")
        outcome = _outcome(path)
        if isinstance(outcome, str):
            refused += 1
            continue
        accepted += 1
        if mutant.value is DELETED or mutant.path[0] != "teams":
            continue
        dumped = {"teams": [t.model_dump() for t in outcome]}
        loaded = _at(dumped, mutant.path)
        assert _same(mutant.value, loaded), f"{source}: {describe(mutant)} was accepted as {loaded!r}"
    print(f"teams file: {len(VALUE_MUTANTS)} value mutants, {refused} refused, {accepted} accepted")
    assert refused > accepted > 0  # the catalogue is mostly wrong values, but not only


def _lines_with_values(text: str) -> list[int]:
    return [i for i, line in enumerate(text.splitlines()) if re.match(r"^\s+(- )?[a-z_0-9]+: \S", line)]


def _text_mutants() -> list[tuple[str, str, str | None]]:
    """(label, text, None if it must be refused, else 'same' if it must load equal to the original)."""
    out: list[tuple[str, str, str | None]] = []
    for name, source in SOURCES.items():
        text = source.read_text(encoding="utf-8")
        lines = text.splitlines(keepends=True)
        for i in _lines_with_values(text):
            line = lines[i]
            indent = len(line) - len(line.lstrip(" -"))
            key, _, value = line.strip().removeprefix("- ").partition(": ")
            if "#" in value or value.startswith(("[", "{", '"', "'")):
                continue
            dup = "".join([*lines[: i + 1], " " * indent + f"{key}: {value}\n", *lines[i + 1 :]])
            out.append((f"{name}:{i + 1} duplicate {key}", dup, None))
            block = f"{line[: len(line) - len(line.lstrip())]}{line.strip().partition(': ')[0]}: |\n"
            block += " " * (indent + 2) + value + "\n"
            out.append(
                (f"{name}:{i + 1} block scalar {key}", "".join([*lines[:i], block, *lines[i + 1 :]]), None)
            )
            # `|-` strips the final newline: the same string; a number or boolean becomes a string (refused).
            stripped = block.replace(": |\n", ": |-\n")
            same = "same" if isinstance(yaml.safe_load(value), str) else None
            out.append((f"{name}:{i + 1} |- {key}", "".join([*lines[:i], stripped, *lines[i + 1 :]]), same))
    return out


TEXT_MUTANTS = _text_mutants()


def test_text_mutants_are_refused_in_one_line_or_mean_the_same(tmp_path: Path) -> None:
    originals = {name: load_teams(source) for name, source in SOURCES.items()}
    for i, (label, text, expect) in enumerate(TEXT_MUTANTS):
        path = tmp_path / f"{i}.yaml"
        path.write_text(text, encoding="utf-8")
        outcome = _outcome(path)
        if expect is None:
            assert isinstance(outcome, str), f"{label}: accepted"
        else:
            assert outcome == originals[label.partition(":")[0]], f"{label}: {outcome}"
    print(f"teams file: {len(TEXT_MUTANTS)} text mutants")
    assert len(TEXT_MUTANTS) > 50


@pytest.mark.parametrize("where", [0, 200, -1])
def test_non_utf8_byte_anywhere_is_one_line(tmp_path: Path, where: int) -> None:
    raw = SOURCES["teams.yaml"].read_bytes()
    at = where % len(raw)
    path = tmp_path / "teams.yaml"
    path.write_bytes(raw[:at] + b"\xfe" + raw[at:])
    message = _outcome(path)
    assert isinstance(message, str) and "not UTF-8 text (byte 0xfe at line" in message


def test_accepted_string_mutants_synthesize_with_the_string_in_the_template(tmp_path: Path) -> None:
    """Synth (nag on) of a handful of accepted mutants, each a separate team of one app."""
    os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")
    from aws_cdk import App

    from infra.app_builder import AppOptions, build_app, cdk_json_context

    base = yaml.safe_load(SOURCES["teams.yaml"].read_text(encoding="utf-8"))
    wanted = {"availability_zones", "admin_principal_arns", "s3_path", "instance_type", "name", "vpc_cidr"}
    chosen: list[tuple[TeamConfig, str]] = []
    for mutant in mutants(base, seed=SEED):
        if not isinstance(mutant.value, str) or not mutant.value or not wanted & set(map(str, mutant.path)):
            continue
        path = tmp_path / f"{len(chosen)}.yaml"
        path.write_text(to_yaml(mutant.data), encoding="utf-8")
        outcome = _outcome(path)
        index = mutant.path[1]
        if isinstance(outcome, str) or any(t.name == outcome[index].name for t, _ in chosen):
            continue
        chosen.append((outcome[index], mutant.value))
        if len(chosen) == 3:
            break
    assert len(chosen) == 3
    app = App(outdir=str(tmp_path / "cdk.out"), context=cdk_json_context())
    build_app(
        app, [t for t, _ in chosen], AppOptions(chart_dir=REPO_ROOT / "k8s", image_dir=REPO_ROOT, nag=True)
    )
    app.synth()
    for team, value in chosen:
        template = (tmp_path / "cdk.out" / f"{team.name}.template.json").read_text()
        assert json.dumps(value)[1:-1] in template, f"{team.name}: {value!r} not in its template"
