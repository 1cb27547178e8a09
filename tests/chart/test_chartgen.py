"""The chart's generated parts (tools/chartgen.py) are up to date with the settings, and the generator
derives each part from the declaration it claims to."""

from __future__ import annotations

import dataclasses

import pytest

from tools import chartgen
from trainer.checkpoint.config import CheckpointConfig
from trainer.config.settings import declared, setting


def test_generated_files_are_up_to_date() -> None:
    """Regenerated in memory and compared: a setting changed without `make chart-gen` fails here."""
    for path, text in chartgen.generated().items():
        assert path.read_text(encoding="utf-8") == text, f"{path.name} is out of date: run make chart-gen"


def _entry(cls: type, name: str, **changes: object) -> chartgen.Entry:
    f, spec = next((f, s) for f, s in declared(cls) if f.name == name)
    spec = dataclasses.replace(spec, **changes)
    return chartgen.Entry(f, spec, int)


def test_a_changed_bound_or_default_reaches_every_generated_file() -> None:
    entry = _entry(CheckpointConfig, "interval_steps", low=2, high=50)
    prop = chartgen.schema_property(entry)
    assert (prop["type"], prop["minimum"], prop["maximum"]) == ("integer", 2, 50)
    assert chartgen.option_line(entry) == "- --ckpt-interval={{ int $v.ckptInterval }}"
    assert chartgen.yaml_scalar(entry) == "100"


def test_an_integer_without_an_upper_bound_is_refused() -> None:
    with pytest.raises(ValueError, match="needs high="):
        chartgen.schema_property(_entry(CheckpointConfig, "interval_steps", high=None))


def test_values_yaml_line_must_exist() -> None:
    with pytest.raises(KeyError, match=r"values\.yaml needs one documented top-level `steps:` line"):
        chartgen.values_text("# no such line\n")


def test_check_mode_reports_a_stale_file(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    stale = tmp_path / "values.yaml"
    stale.write_text(chartgen.VALUES.read_text().replace("ckptInterval: 100", "ckptInterval: 7"))
    monkeypatch.setattr(chartgen, "VALUES", stale)
    assert chartgen.stale() == [stale]
    assert chartgen.main(["--check"]) == 1


def test_a_chart_value_without_a_default_helm_can_hold_is_refused() -> None:
    """Helm deletes a null value's key: a None default would leave the chart's value missing."""

    @dataclasses.dataclass(frozen=True)
    class Optional:
        x: float | None = setting("--x", "x", default=None, kind=float, chart="x")

    with pytest.raises(ValueError, match="--x: a chart value needs a default other than None"):
        list(chartgen.entries({"o": Optional}))
