"""The checkpoint options of trainer/checkpoint/config.py reach the trainer from the chart, as written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.chart.helm import rejection, rendered_trainer_config


def test_chart_defaults_are_the_trainers_defaults(tmp_path: Path) -> None:
    from trainer.checkpoint.config import CheckpointConfig

    ckpt = rendered_trainer_config(tmp_path, {}).ckpt
    default = CheckpointConfig(dir=ckpt.dir)
    for name in ("write_timeout_s", "failure_limit", "allow_fresh_start", "mode"):
        assert getattr(ckpt, name) == getattr(default, name), name


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({"ckptWriteTimeout": 1800, "ckptFailureLimit": 7}, {"write_timeout_s": 1800.0, "failure_limit": 7}),
        ({"ckptWriteTimeout": 2.5}, {"write_timeout_s": 2.5}),
        ({"allowFreshStart": True}, {"allow_fresh_start": True}),
    ],
)
def test_checkpoint_values_reach_the_trainer(
    tmp_path: Path, values: dict[str, Any], expected: dict[str, Any]
) -> None:
    ckpt = rendered_trainer_config(tmp_path, values).ckpt
    assert {name: getattr(ckpt, name) for name in expected} == expected


@pytest.mark.parametrize(
    "values",
    [{"ckptWriteTimeout": 0}, {"ckptFailureLimit": 0}, {"allowFreshStart": "yes"}],
)
def test_schema_rejects_bad_checkpoint_values(values: dict[str, Any]) -> None:
    stderr = rejection(values)
    assert "values don't meet the specifications of the schema(s)" in stderr
    assert f"at '/{next(iter(values))}'" in stderr
