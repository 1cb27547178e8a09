"""The chart and the trainer agree on every render-time rule they share: for generated values, `helm
template` accepts exactly when the trainer accepts the same settings (its TrainConfig, and the reference
entry point's own options after `--`: the sequence length within the preset).

Rules compared: timeouts that nest (collective < soft < hard < barrier < heartbeat; 1 s < liveness <=
hard; liveness < hang floor), faults that fire (a step the run reaches; an in-save fault at a save at or
after its step, the final step always saving) and the sequence length of the preset. The launcher-only
rules (ftWorkloadCheckInterval, monitorInterval, ftInitialRankHeartbeatTimeout) are held valid: the
trainer never sees those values. A few dozen renders (~0.2 s each).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.chart.helm import rendered_trainer_config, template_result
from trainer.config.components import CHART_TABLE
from trainer.config.train_config import ConfigError, config_from_args
from trainer.reference.config import REFERENCE_CHART_TABLE, chart_values, reference_config

FAULT_KINDS = ("exception", "sigkill", "ckpt-crash", "ckpt-write-error")

# Launcher-only values that pass whatever the generated timeouts are.
LAUNCHER = {"ftWorkloadCheckInterval": 0.5, "monitorInterval": 0.2, "ftInitialRankHeartbeatTimeout": 100}


@st.composite
def settings_by_field(draw: st.DrawFn) -> dict[str, Any]:
    """Settings near the rules' edges: each step of the timeout chain may be equal (refused) or grow,
    liveness around its bounds, faults around the run's end, the sequence length around the preset's."""
    steps = draw(st.integers(min_value=1, max_value=40))
    chain = [draw(st.integers(min_value=1, max_value=4))]
    for _ in range(4):
        chain.append(chain[-1] + draw(st.sampled_from([0, 1, 1, 2, 2, 3, 3, 4, 5])))
    hard = chain[2]
    liveness = draw(st.sampled_from([1, 2, hard, hard, hard + 1]))
    floor = liveness + draw(st.sampled_from([0, 1, 1, 4]))
    names = ("collective_timeout", "inprocess_soft_timeout", "inprocess_hard_timeout")
    names += ("inprocess_barrier_timeout", "heartbeat_timeout")
    out: dict[str, Any] = {f"timeouts.{n}": float(v) for n, v in zip(names, chain, strict=True)}
    out["timeouts.inprocess_liveness_timeout"] = float(liveness)
    out["timeouts.hang_timeout_floor"] = float(floor)
    out["model.preset"] = "tiny"
    out["data.seq_len"] = draw(st.sampled_from([32, 64, 512, 513]))
    out["run.steps"] = steps
    out["ckpt.interval_steps"] = draw(st.integers(min_value=1, max_value=50))
    kind = draw(st.sampled_from(FAULT_KINDS))
    step = draw(st.integers(min_value=max(0, steps - 3), max_value=steps + 1))
    out["faults.specs"] = {"gen": f"{kind}:step={step}"}
    return out


def trainer_argv(by_field: dict[str, Any], data: Path, out: Path) -> list[str]:
    """The trainer's options for these settings, through the tables (what the chart renders): the
    library's, then `--` and the reference model's."""
    flags = {row.field: row.flag for row in CHART_TABLE}
    ours = {row.field: row.flag for row in REFERENCE_CHART_TABLE}
    argv = [f"--out-dir={out}", "--device=cpu"]
    entry = [f"--data-path={data}"]
    for name, value in by_field.items():
        if name == "faults.specs":
            argv += [f"--fault={spec}" for _, spec in sorted(value.items())]
        elif name in ours:
            entry.append(f"{ours[name]}={value}")
        else:
            argv.append(f"{flags[name]}={value}")
    return [*argv, "--", *entry]


def trainer_accepts(argv: list[str]) -> tuple[bool, str]:
    try:
        cfg = config_from_args(argv, env={})
        reference_config(cfg.run.entry_args)  # the reference entry point's check (checked_by)
    except ConfigError as exc:
        return False, str(exc)
    return True, ""


def test_chart_and_trainer_accept_the_same_settings(tmp_path: Path) -> None:
    data = tmp_path / "tokens.npy"
    np.save(data, np.zeros(4096, dtype=np.uint16))
    outcomes: list[bool] = []

    # derandomize: the same examples on every run, so CI cannot draw a set without both outcomes.
    @settings(max_examples=36, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
    @given(by_field=settings_by_field())
    def agree(by_field: dict[str, Any]) -> None:
        outcomes.append(_agree(by_field, data, tmp_path))

    agree()
    # Both outcomes in bulk: a generator that only made valid (or only invalid) settings proves little.
    assert outcomes.count(True) >= 5 and outcomes.count(False) >= 5, outcomes


def _agree(by_field: dict[str, Any], data: Path, tmp_path: Path) -> bool:
    values = {**chart_values(by_field), **LAUNCHER, "nodes": 1, "gpusPerNode": 2, "device": "cpu"}
    chart = template_result({**values, "dataPath": str(data)})
    trainer_ok, trainer_why = trainer_accepts(trainer_argv(by_field, data, tmp_path / "out"))
    where = f"settings {by_field}\nchart: {chart.stderr.strip()[:300]}\ntrainer: {trainer_why}"
    assert (chart.returncode == 0) == trainer_ok, where
    if trainer_ok:  # and what the chart renders is what the trainer was judged on
        cfg = rendered_trainer_config(tmp_path, values)
        assert cfg.run.steps == by_field["run.steps"], where
        assert [s.step for s in cfg.faults.specs] == [int(by_field["faults.specs"]["gen"].split("=")[1])]
    return trainer_ok


def test_the_final_save_case_is_accepted_by_both(tmp_path: Path) -> None:
    """The case that used to disagree: no interval save at or after step 950, but the final one."""
    data = tmp_path / "tokens.npy"
    np.save(data, np.zeros(4096, dtype=np.uint16))
    by_field = {"run.steps": 1000, "ckpt.interval_steps": 300, "faults.specs": {"a": "ckpt-crash:step=950"}}
    assert template_result({**chart_values(by_field), "dataPath": str(data)}).returncode == 0
    assert trainer_accepts(trainer_argv(by_field, data, tmp_path / "out")) == (True, "")
    late = {**by_field, "faults.specs": {"a": "ckpt-crash:step=1000"}}
    assert template_result({**chart_values(late), "dataPath": str(data)}).returncode != 0
    assert not trainer_accepts(trainer_argv(late, data, tmp_path / "out"))[0]
