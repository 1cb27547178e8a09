"""Generated teams files per class of the third bad-input sweep: random members of each class, each refused
by `python -m infra.teams` (run in-process) with exit 2 and one line naming the field as written, or read
exactly as written.

Classes here: scalars YAML 1.1 and YAML 1.2 read differently (leading zeros, sexagesimal, underscores,
0b/0o prefixes, exponents without a dot, y/n/yes/no/on/off, dates), as keys or values at any depth;
characters YAML does not allow (NUL and C0 controls); numbers that are not finite (.inf, .nan); any
number in any numeric field, refused (if at all) naming the field as the teams file spells it.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from infra.config import TeamsConfigError, parse_teams
from infra.teams.__main__ import main as validate
from sizing.yaml_readings import core_reading, reading_problem, yaml11_reading
from tests.helpers import REPO_ROOT

BASE_TEXT = (REPO_ROOT / "teams.yaml").read_text(encoding="utf-8")
BASE = yaml.safe_load(BASE_TEXT)
FAST = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))


def run_validate(tmp: Path, text: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """(exit status, stderr's lines) of `python -m infra.teams FILE`, in-process (any traceback fails)."""
    path = tmp / "teams.yaml"
    path.write_text(text, encoding="utf-8")
    capsys.readouterr()
    status = validate([str(path)])
    return status, capsys.readouterr().err


def one_error(status: int, err: str, field: str) -> str:
    lines = err.splitlines()
    assert status == 2, err
    assert len(lines) == 1 and lines[0].startswith(f"error: {field}: "), err
    return lines[0]


# Each: a plain scalar YAML 1.1 reads as one thing and YAML 1.2 as another.
leading_zero = st.integers(8, 4095).map(lambda n: "0" + oct(n)[2:])  # 010, 0755: octal in 1.1
leading_zero_89 = st.integers(0, 999).map(lambda n: f"0{n}8")  # 08, 0128: strings in 1.1, ints in 1.2
sexagesimal = st.tuples(st.integers(1, 99), st.integers(0, 59)).map(lambda p: f"{p[0]}:{p[1]:02d}")
underscored = st.tuples(st.integers(1, 999), st.integers(0, 999)).map(lambda p: f"{p[0]}_{p[1]:03d}")
prefixed = st.one_of(
    st.integers(1, 255).map(lambda n: f"0b{n:b}"), st.integers(1, 4095).map(lambda n: f"0o{n:o}")
)
no_dot_exponent = st.tuples(st.integers(1, 99), st.integers(0, 9)).map(lambda p: f"{p[0]}e{p[1]}")
bool_words = st.sampled_from(
    ["y", "Y", "yes", "Yes", "YES", "n", "N", "no", "No", "NO", "on", "On", "ON", "off", "Off", "OFF"]
)
dates = st.dates().map(lambda d: d.isoformat()).filter(lambda t: len(t) == 10)
ambiguous = st.one_of(
    leading_zero, leading_zero_89, sexagesimal, underscored, prefixed, no_dot_exponent, bool_words, dates
)

# (field as the error names it, the line of teams.yaml that holds it, its replacement template).
NUMERIC_FIELDS = [
    (
        "teams[0].gpu_node_group.desired_nodes",
        "desired_nodes: 2\n      spare",
        "desired_nodes: {}\n      spare",
    ),
    ("teams[0].gpu_node_group.max_nodes", "max_nodes: 4\n      capacity", "max_nodes: {}\n      capacity"),
    ("teams[0].gpu_quota", "gpu_quota: 32", "gpu_quota: {}"),
    ("teams[0].fsx.storage_gib", "storage_gib: 2400", "storage_gib: {}"),
    ("teams[1].fsx.throughput_per_tib", "throughput_per_tib: 1000", "throughput_per_tib: {}"),
    ("teams[0].name", "name: ml-research", "name: {}"),
    ("teams[0].endpoint_access", "endpoint_access: private", "endpoint_access: {}"),
]


@FAST
@given(value=ambiguous, field=st.sampled_from(NUMERIC_FIELDS))
def test_scalar_read_differently_by_yaml_1_1_and_1_2_is_refused_at_its_line(
    tmp_path_factory: pytest.TempPathFactory,
    capsys: pytest.CaptureFixture[str],
    value: str,
    field: tuple[str, str, str],
) -> None:
    name, old, new = field
    assert reading_problem(value), value  # the generator makes members of the class only
    text = BASE_TEXT.replace(old, new.format(value), 1)
    line = text[: text.index(new.format(value))].count("\n") + 1
    status, err = run_validate(tmp_path_factory.mktemp("t"), text, capsys)
    out = one_error(status, err, name)
    assert f"(line {line}, column" in out and "YAML 1.1" in out, out


@FAST
@given(word=bool_words, where=st.sampled_from(["top", "team", "nested"]))
def test_boolean_looking_key_is_refused_naming_it(
    tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str], word: str, where: str
) -> None:
    if where == "top":
        text, field = f"{word}: 1\n" + BASE_TEXT, word
    elif where == "team":
        text, field = (
            BASE_TEXT.replace("  - name: llm-platform", f"  - {word}: 1\n    name: llm-platform"),
            f"teams[1].{word}",
        )
    else:
        text, field = (
            BASE_TEXT.replace("    fsx:\n", f"    fsx:\n      {word}: 1\n", 1),
            f"teams[0].fsx.{word}",
        )
    status, err = run_validate(tmp_path_factory.mktemp("t"), text, capsys)
    assert "key " in one_error(status, err, field)


@FAST
@given(
    value=st.one_of(
        st.integers(0, 10**6).map(str),
        st.floats(allow_nan=False, allow_infinity=False, min_value=0, max_value=1e6).map(repr),
        st.sampled_from(["true", "false", "null", "~", "0x1F", ".inf", "-.inf", ".nan", "+7", "0", "1.5e-3"]),
        st.from_regex(r"[a-z][a-z0-9-]{2,12}", fullmatch=True),
    )
)
def test_a_scalar_accepted_is_what_pyyaml_and_yaml_1_2_both_read(value: str) -> None:
    """Whatever the check lets through, PyYAML (the teams check) reads as YAML 1.2 does (Helm, Go)."""
    assert reading_problem(value) is None, value
    loaded = yaml.safe_load(f"v: {value}")["v"]
    kind, expected = core_reading(value)
    assert yaml11_reading(value)[0] == kind
    if kind == "float" and expected != expected:  # nan
        assert loaded != loaded
    else:
        assert loaded == expected and type(loaded) is type(expected), (value, loaded, expected)


def test_quoted_forms_are_read_as_written(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Quoting is the way out every message names: a quoted `yes` is a string to both readers."""
    text = BASE_TEXT.replace(
        "    gpu_quota: 32", '    gpu_quota: 32\n    observability:\n      alarm_topic_name: "010"'
    )
    status, err = run_validate(tmp_path, text, capsys)
    assert status == 0, err


@pytest.mark.parametrize("char", ["\x00", "\x01", "\x07", "\x1b", "\x7f"])
def test_character_yaml_refuses_names_line_and_column(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], char: str
) -> None:
    text = BASE_TEXT.replace("gpu_quota: 32", f"gpu_quota: 3{char}2")
    status, err = run_validate(tmp_path, text, capsys)
    line = text[: text.index(char)].count("\n") + 1
    assert status == 2 and len(err.splitlines()) == 1, err
    assert re.search(rf"invalid YAML at line {line}, column \d+: the character U\+00", err), err


@pytest.mark.parametrize(
    ("written", "field"),
    [
        ("reload_budget_minutes: .inf", "teams[0].checkpoints.reload_budget_minutes"),
        ("step_seconds: .nan", "teams[0].checkpoints.step_seconds"),
        ("node_mbps: .Inf", "teams[0].checkpoints.node_mbps"),
        ("interval_minutes: -.inf", "teams[0].checkpoints.interval_minutes"),
    ],
)
def test_non_finite_numbers_name_the_field_as_written_with_its_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], written: str, field: str
) -> None:
    text = BASE_TEXT.replace("gpu_quota: 32", f"gpu_quota: 32\n    checkpoints:\n      {written}")
    status, err = run_validate(tmp_path, text, capsys)
    line = text[: text.index(written)].count("\n") + 1
    out = one_error(status, err, field)
    assert out.endswith(f"(line {line})") and "_s " not in out, out


def test_every_reading_of_the_example_file_is_unambiguous() -> None:
    """The shipped teams.yaml holds no scalar the check refuses (its own examples read alike)."""
    for event in yaml.parse(BASE_TEXT):
        if isinstance(event, yaml.ScalarEvent) and not event.style:
            assert reading_problem(event.value) is None, event.value


# ---- errors name the field as written, whatever the number -------------------------------------------

# (where the field sits in a team, its name, whether an integer): every number a user writes.
NUMBER_FIELDS = [
    (("checkpoints",), "parameters", True),
    (("checkpoints",), "interval_minutes", False),
    (("checkpoints",), "interval_steps", True),
    (("checkpoints",), "step_seconds", False),
    (("checkpoints",), "keep", True),
    (("checkpoints",), "reload_budget_minutes", False),
    (("checkpoints",), "node_mbps", False),
    (("gpu_node_group",), "desired_nodes", True),
    (("gpu_node_group",), "spare_nodes", True),
    (("gpu_node_group",), "root_volume_gib", True),
    (("fsx",), "storage_gib", True),
    ((), "gpu_quota", True),
    (("observability",), "scrape_interval_s", True),
    (("observability", "alarms"), "max_checkpoint_age_minutes", True),
    (("observability", "alarms"), "min_goodput_last_hour", False),
]
INTERNAL_NAMES = re.compile(r"\b(reload_budget_s|interval_s|step_s|checkpoint_bytes|nodes_mbps|write_s)\b")
EXTREME_FLOATS = [5e-324, 1e-300, 1e-9, 1e-3, -0.0, 0.5, 1.0, 3599.999, 1e15, 1e308, -1e308]
EXTREME_INTS = [-(2**63), -1, 0, 1, 2, 450, 10**6, 10**12 + 1, 2**53 + 1, 2**63 - 1]


def _one_team_with(where: tuple[str, ...], name: str, value: Any) -> dict[str, Any]:
    team = copy.deepcopy(BASE["teams"][0])
    node = team
    for part in where:
        node = node.setdefault(part, {})
    node[name] = value
    return {"teams": [team]}


def _accepted_or_named(data: dict[str, Any]) -> None:
    """Accepted, or refused in one line naming a field as the teams file spells it; anything else (an
    overflow's traceback) fails the test."""
    try:
        parse_teams(data)
    except TeamsConfigError as exc:
        line = str(exc)
        assert "\n" not in line and re.match(r"teams\[0\](\.[a-z_]+)*: ", line), line
        assert not INTERNAL_NAMES.search(line.replace("scrape_interval_s", "")), line


@pytest.mark.parametrize(("where", "name", "integer"), NUMBER_FIELDS)
def test_extreme_numbers_are_accepted_or_refused_naming_the_field_as_written(
    where: tuple[str, ...], name: str, integer: bool
) -> None:
    """No number reaches a traceback (an overflow in the sizing) or a message naming the sizing model's
    own fields (reload_budget_s)."""
    for value in EXTREME_INTS if integer else EXTREME_FLOATS:
        _accepted_or_named(_one_team_with(where, name, value))


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(field=st.sampled_from(NUMBER_FIELDS), data=st.data())
def test_any_number_is_accepted_or_refused_naming_the_field_as_written(
    field: Any, data: st.DataObject
) -> None:
    where, name, integer = field
    value = data.draw(
        st.integers(-(2**63), 2**63 - 1) if integer else st.floats(allow_nan=False, allow_infinity=False)
    )
    _accepted_or_named(_one_team_with(where, name, value))


@pytest.mark.parametrize("directive", ["", "%YAML 1.2\n---\n"])
@pytest.mark.parametrize(
    ("old", "new", "field"),
    [
        (
            "desired_nodes: 2\n      spare",
            "desired_nodes: 010\n      spare",
            "teams[0].gpu_node_group.desired_nodes",
        ),
        (
            "max_nodes: 4\n      capacity",
            "max_nodes: 1:30\n      capacity",
            "teams[0].gpu_node_group.max_nodes",
        ),
        ("gpu_quota: 32", "gpu_quota: 020", "teams[0].gpu_quota"),
    ],
)
def test_issue_examples_refused_whatever_the_yaml_directive(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], directive: str, old: str, new: str, field: str
) -> None:
    status, err = run_validate(tmp_path, directive + BASE_TEXT.replace(old, new, 1), capsys)
    assert "YAML 1.1" in one_error(status, err, field)
