"""Bad values fail at template time with a message naming the value (schema or _validate.tpl)."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from tests.chart.helm import CHART, rejection, template_result

STORAGE = {"claimName": "fsx", "mountPath": "/fsx", "localNvmePath": "/mnt/nvme"}
SCHEMA_ERROR = "values don't meet the specifications of the schema(s)"


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"nodes": 0}, "at '/nodes': minimum: got 0, want 1"),
        ({"nodes": -3}, "at '/nodes': minimum: got -3, want 1"),
        ({"nodes": 2.5}, "at '/nodes': got number, want integer"),
        ({"gpusPerNode": 7.5}, "at '/gpusPerNode': got number, want integer"),
        ({"gpusPerNode": "8"}, "at '/gpusPerNode': got string, want integer"),
        ({"efaPerNode": 1.5}, "at '/efaPerNode'"),
        ({"instanceType": "p3dn.24xlarge"}, "at '/instanceType': value must be one of 'p5.48xlarge'"),
        ({"instanceType": "P5.48XLARGE"}, "at '/instanceType': value must be one of"),
        ({"storage": {**STORAGE, "claimName": ""}}, "at '/storage/claimName'"),
        ({"storage": {**STORAGE, "mountPath": "fsx"}}, "at '/storage/mountPath'"),
        ({"preset": "405b"}, "at '/preset'"),
        ({"ckptMode": "async"}, "at '/ckptMode'"),
        ({"collectiveTimeout": 0}, "at '/collectiveTimeout'"),
        ({"faults": {"x": "explode:step=3"}}, "at '/faults/x'"),
        ({"faults": {"x": "sigkill"}}, "at '/faults/x'"),
        ({"nodez": 4}, "additional properties 'nodez' not allowed"),
        ({"image": {"repository": ""}}, "at '/image/repository'"),
        ({"hugepages2Mi": "5 GB"}, "at '/hugepages2Mi'"),
    ],
)
def test_schema_rejects(values: dict[str, Any], message: str) -> None:
    stderr = rejection(values)
    assert SCHEMA_ERROR in stderr
    assert message in stderr


def test_set_flag_with_a_fraction_is_rejected_too() -> None:
    result = template_result(None, "--set", "gpusPerNode=2.5")
    assert result.returncode != 0
    assert "at '/gpusPerNode'" in result.stderr


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"collectiveTimeout": 200},
            "timeouts must nest: collectiveTimeout (200 s) must be less than inprocessSoftTimeout (180 s)",
        ),
        (
            {"inprocessSoftTimeout": 300},
            "timeouts must nest: inprocessSoftTimeout (300 s) must be less than inprocessHardTimeout (300 s)",
        ),
        (
            {"inprocessBarrierTimeout": 900},
            "inprocessBarrierTimeout (900 s) must be less than ftRankHeartbeatTimeout (600 s)",
        ),
        (
            {"inprocess": False, "inprocessBarrierTimeout": 900},
            "inprocessBarrierTimeout (900 s) must be less than ftRankHeartbeatTimeout (600 s)",
        ),
        (
            {"ftRankHeartbeatTimeout": 1500},
            "ftRankHeartbeatTimeout (1500 s) must not exceed ftInitialRankHeartbeatTimeout (1200 s)",
        ),
        (
            {"ftWorkloadCheckInterval": 700},
            "ftWorkloadCheckInterval (700 s) must be less than ftRankHeartbeatTimeout (600 s)",
        ),
        ({"failJobExitCodes": [3, 2]}, "failJobExitCodes must be in increasing order"),
    ],
)
def test_template_rejects_combinations(values: dict[str, Any], message: str) -> None:
    assert message in rejection(values)


TIMEOUT_CASES = [
    (60, 90, 120, 180, 300),
    (1, 2, 3, 4, 5),
    (0.5, 1.5, 2.5, 3.5, 4.5),
    (90, 90, 120, 180, 300),
    (60, 90, 80, 180, 300),
    (60, 90, 120, 400, 300),
    (10, 20, 30, 40, 40),
]


@pytest.mark.parametrize("timeouts", TIMEOUT_CASES)
def test_chart_and_trainer_agree_on_nesting(timeouts: tuple[float, ...]) -> None:
    """The chart rejects exactly the timeouts the trainer would reject at start-up."""
    from trainer.resilience.timeouts import TimeoutNestingError, Timeouts

    collective, soft, hard, barrier, heartbeat = timeouts
    liveness = min(10, hard)  # the chart's default, lowered to fit under the hard timeout
    try:
        Timeouts(collective, soft, hard, barrier, heartbeat, inprocess_liveness_timeout=liveness).check()
        trainer_ok = True
    except TimeoutNestingError:
        trainer_ok = False
    values = {
        "collectiveTimeout": collective,
        "inprocessSoftTimeout": soft,
        "inprocessHardTimeout": hard,
        "inprocessBarrierTimeout": barrier,
        "ftRankHeartbeatTimeout": heartbeat,
        "inprocessLivenessTimeout": liveness,
        "ftInitialRankHeartbeatTimeout": max(heartbeat, 10),
        "ftWorkloadCheckInterval": 0.2,
        "monitorInterval": 0.1,
    }
    result = template_result(values)
    assert (result.returncode == 0) == trainer_ok, result.stderr


def test_schema_fault_kinds_are_the_trainers() -> None:
    from trainer.runtime.faults import FAULT_KINDS

    schema = json.loads((CHART / "values.schema.json").read_text())
    pattern = schema["properties"]["faults"]["additionalProperties"]["pattern"]
    kinds = re.match(r"\^\(([^)]*)\)", pattern)
    assert kinds is not None
    assert set(kinds.group(1).split("|")) == set(FAULT_KINDS)


def test_every_value_is_documented_and_in_the_schema() -> None:
    """Each top-level value has a comment starting with its name, and a schema entry."""
    import yaml

    text = (CHART / "values.yaml").read_text()
    values = yaml.safe_load(text)
    schema = json.loads((CHART / "values.schema.json").read_text())
    for name, value in values.items():
        assert name in schema["properties"], f"{name} missing from values.schema.json"
        nested = isinstance(value, dict) and name in ("image", "storage")
        keys = [f"{name}.{k}" for k in value] if nested else [name]
        for key in keys:
            assert re.search(rf"^\s*# {re.escape(key)} ", text, re.MULTILINE), f"{key} has no comment"
