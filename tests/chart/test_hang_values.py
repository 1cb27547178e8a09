"""The chart's hang-timeout values (hangTimeoutFloor, hangTimeoutFactor, hangWarmupSteps): defaults equal
the trainer's, values reach the trainer as written, and the chart rejects what the trainer would."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chart.helm import rejection, rendered_trainer_config, template_result

SCHEMA_ERROR = "values don't meet the specifications of the schema(s)"


def test_defaults_are_the_trainers_and_values_arrive_as_written(tmp_path: Path) -> None:
    from trainer.resilience.timeouts import Timeouts

    t = rendered_trainer_config(tmp_path, {}).timeouts
    d = Timeouts()
    assert (t.hang_timeout_floor, t.hang_timeout_factor, t.hang_warmup_steps) == (
        d.hang_timeout_floor,
        d.hang_timeout_factor,
        d.hang_warmup_steps,
    )
    values = {"hangTimeoutFloor": 12.5, "hangTimeoutFactor": 2.5, "hangWarmupSteps": 0}
    t = rendered_trainer_config(tmp_path, values).timeouts
    assert (t.hang_timeout_floor, t.hang_timeout_factor, t.hang_warmup_steps) == (12.5, 2.5, 0)


def test_schema_rejects_each_bad_value_by_name() -> None:
    # One render: helm reports every schema violation at once.
    bad = {"hangTimeoutFloor": 0, "hangTimeoutFactor": 1, "hangWarmupSteps": 2.5}
    stderr = rejection(bad)
    assert SCHEMA_ERROR in stderr
    for name in bad:
        assert f"at '/{name}'" in stderr, name
    stderr = rejection({"hangTimeoutFloor": "60", "hangWarmupSteps": -1})
    assert "at '/hangTimeoutFloor'" in stderr and "at '/hangWarmupSteps'" in stderr


@pytest.mark.parametrize(
    ("floor", "liveness", "check_interval"),
    [(60, 10, 5), (10, 10, 5), (11, 10, 5), (5, 2, 5)],
)
def test_chart_and_trainer_agree_on_the_floor(floor: float, liveness: float, check_interval: float) -> None:
    """The floor must exceed the liveness timeout (trainer and chart) and the launcher's check interval
    (chart only: the trainer does not know it)."""
    from trainer.resilience.timeouts import TimeoutNestingError, Timeouts

    try:
        Timeouts(hang_timeout_floor=floor, inprocess_liveness_timeout=liveness).check()
        trainer_ok = True
    except TimeoutNestingError as exc:
        assert exc.field == "hang_timeout_floor"
        trainer_ok = False
    values = {
        "hangTimeoutFloor": floor,
        "inprocessLivenessTimeout": liveness,
        "ftWorkloadCheckInterval": check_interval,
    }
    result = template_result(values)
    assert (result.returncode == 0) == (trainer_ok and floor > check_interval), result.stderr
    if result.returncode != 0:
        assert "must be less than hangTimeoutFloor" in result.stderr
