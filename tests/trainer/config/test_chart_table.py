"""The chart-to-trainer tables, checked both ways: the library's (trainer/config/components.py CHART_TABLE)
and the reference model's (trainer/reference/config.py REFERENCE_CHART_TABLE, rendered after `--`). Every
chart value the trainer's command renders has a row, and every row's option exists in its generated CLI,
its value in values.yaml and values.schema.json, and a value set through the row arrives in its field."""

from __future__ import annotations

import json
import re
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.chart.helm import REPO_ROOT as REPO
from tests.chart.helm import env_of, render, rendered_trainer_config, trainer_container, workload_pod_spec
from trainer.config.components import CHART_TABLE, COMPONENTS, chart_values
from trainer.config.settings import declared
from trainer.config.train_config import TrainConfig, make_parser
from trainer.reference import config as reference
from trainer.snapshot.config import DEFAULT_DIR as SNAPSHOT_DEFAULT_DIR

ARGS_TPL = REPO / "k8s" / "templates" / "_trainer_args.tpl"

# One non-default value per row, by field: set through the table, read back from the TrainConfig the
# trainer parses out of the rendered pod command.
SAMPLE: dict[str, Any] = {
    "run.steps": 77,
    "run.seed": 5,
    "run.device": "cpu",
    "run.inprocess": False,
    "run.max_repeated_faults": 2,
    "run.straggler_policy": "report",
    "run.entrypoint": "team.train:main",
    "timeouts.collective_timeout": 11.0,
    "timeouts.inprocess_soft_timeout": 12.0,
    "timeouts.inprocess_hard_timeout": 13.0,
    "timeouts.inprocess_barrier_timeout": 14.0,
    "timeouts.heartbeat_timeout": 15.0,
    "timeouts.inprocess_liveness_timeout": 9.0,
    "timeouts.hang_timeout_floor": 10.0,
    "timeouts.hang_timeout_factor": 2.5,
    "timeouts.hang_warmup_steps": 8,
    "ckpt.interval_steps": 7,
    "ckpt.keep_latest": 2,
    "ckpt.mode": "sync",
    "ckpt.write_timeout_s": 123.0,
    "ckpt.failure_limit": 4,
    "ckpt.allow_fresh_start": True,
    "snapshot.interval_steps": 3,
    "snapshot.replication": False,
    "metrics.port": 9100,
    "metrics.linger": 7.0,
    "faults.specs": {"a": "exception:step=3:rank=1"},
    "faults.seed": 9,
    "guard.enabled": False,
    "guard.spike_factor": 4.5,
    "guard.window": 7,
    "guard.suspect_trips": 3,
}


# The same for the reference model's rows, rendered when the entry point is the reference.
REFERENCE_SAMPLE: dict[str, Any] = {
    "model.preset": "small",
    "data.seq_len": 64,
    "data.micro_batch_size": 3,
    "optim.lr": 0.002,
}


def _field_value(cfg: Any, dotted: str) -> Any:
    component, name = dotted.split(".")
    return getattr(getattr(cfg, component), name)


def _pod_template_block(name: str) -> str:
    text = ARGS_TPL.read_text()
    start = text.index(f'{{{{- define "{name}" -}}}}')
    end = text.find("{{- end }}\n\n", start)
    return text[start : end if end >= 0 else len(text)]


def test_every_row_is_an_option_of_the_generated_cli_and_a_chart_value() -> None:
    options = {o for a in make_parser()._actions for o in a.option_strings}
    values = yaml.safe_load((REPO / "k8s" / "values.yaml").read_text())
    schema = json.loads((REPO / "k8s" / "values.schema.json").read_text())["properties"]
    assert len({r.flag for r in CHART_TABLE}) == len(CHART_TABLE), "one row per option"
    for row in CHART_TABLE:
        assert row.flag in options, row
        if not row.is_place:
            assert row.value in values, f"{row.value} is not in k8s/values.yaml"
            assert row.value in schema, f"{row.value} is not in k8s/values.schema.json"
    ref_options = {o for a in reference.make_parser()._actions for o in a.option_strings}
    for row in reference.REFERENCE_CHART_TABLE:
        assert row.flag in ref_options and row.flag not in options, row
        if not row.is_place:
            assert row.value in values and row.value in schema, row
    # TrainConfig is exactly the components, each declared with `setting` (nothing undeclared).
    assert [f.name for f in fields(TrainConfig)][:1] == ["ckpt"]
    assert {f.name for f in fields(TrainConfig)} == set(COMPONENTS)
    assert {f.name for f in fields(reference.ReferenceConfig)} == set(reference.REFERENCE_COMPONENTS)
    for cls in (*COMPONENTS.values(), *reference.REFERENCE_COMPONENTS.values()):
        assert [f.name for f in fields(cls)] == [f.name for f, _ in declared(cls)], cls


def test_every_chart_value_the_trainer_command_reads_has_a_row() -> None:
    """Both ways, statically: the `$v.<key>` references of the generated _trainer_args.tpl are the
    table's values (extraTrainerArgs passes options through as written), and the `$(ENV)` ones its places."""
    for name, table in (
        ("trainer.settingArgs", CHART_TABLE),
        ("trainer.referenceArgs", reference.REFERENCE_CHART_TABLE),
    ):
        block = _pod_template_block(name)
        read = set(re.findall(r"\$v\.([A-Za-z0-9]+)", block)) - {"extraTrainerArgs"}
        assert read == {r.value for r in table if not r.is_place}, name
        places = set(re.findall(r"--[a-z-]+=\$\(([A-Z_]+)\)", block))
        assert places == {r.value for r in table if r.is_place}, name


def test_a_value_set_through_the_table_arrives_in_its_field(tmp_path: Path) -> None:
    rows = [r for r in CHART_TABLE if not r.is_place]
    assert {r.field for r in rows} == set(SAMPLE), "a row without a sample value"
    values = chart_values(SAMPLE)
    cfg = rendered_trainer_config(tmp_path, {**values, "nodes": 1})
    for row in rows:
        got = _field_value(cfg, row.field)
        want = SAMPLE[row.field]
        if row.field == "faults.specs":
            assert [str(s) for s in got] == ["exception:step=3:rank=1:node=0"]
        else:
            assert got == want and type(got) is type(want), (row, got, want)
    # Every trainer option in the rendered command is a row's (no option the table does not know).
    container = trainer_container(render({**values, "nodes": 1}))
    args = container["args"][container["args"].index("trainer") + 1 :]
    rendered = {a.split("=", 1)[0].replace("--no-", "--") for a in args}
    assert rendered == {r.flag for r in CHART_TABLE}
    env = env_of(container)
    assert {r.value for r in CHART_TABLE if r.is_place} <= set(env)


def test_a_reference_value_set_through_the_table_arrives_in_its_field(tmp_path: Path) -> None:
    """The reference model's values reach its own options after `--` (job.args), not the library's."""
    rows = [r for r in reference.REFERENCE_CHART_TABLE if not r.is_place]
    assert {r.field for r in rows} == set(REFERENCE_SAMPLE), "a row without a sample value"
    values = {**reference.chart_values(REFERENCE_SAMPLE), "nodes": 1}
    cfg = rendered_trainer_config(tmp_path, values)
    assert cfg.run.entrypoint == "trainer.reference:train"
    ref = reference.reference_config(cfg.run.entry_args)
    for row in rows:
        got, want = _field_value(ref, row.field), REFERENCE_SAMPLE[row.field]
        assert got == want and type(got) is type(want), (row, got, want)
    assert ref.data.path == tmp_path / "tokens.npy"  # the place $(DATA_PATH), expanded
    container = trainer_container(render(values))
    entry = container["args"][container["args"].index("--") + 1 :]
    assert {a.split("=", 1)[0] for a in entry} == {r.flag for r in reference.REFERENCE_CHART_TABLE}
    assert {r.value for r in reference.REFERENCE_CHART_TABLE if r.is_place} <= set(env_of(container))
    # A team's entry point gets none of them.
    team = trainer_container(render({**values, "entrypoint": "team.train:main"}))
    assert "--" not in team["args"] and not any(a.startswith("--data-path") for a in team["args"])


def test_the_snapshot_directory_is_the_trainers_default_inside_the_pods_memory_mount() -> None:
    """One definition of the path (trainer/snapshot/config.py): the chart names no snapshot directory, and
    the trainer's default lies on the pod's memory-backed emptyDir, so snapshots cost no disk and
    outlive the worker process, not the pod."""
    manifests = render(chart_values({"snapshot.interval_steps": 2}))
    container = trainer_container(manifests)
    assert not [a for a in container["args"] if a.startswith("--snapshot-dir")], container["args"]
    assert "SNAPSHOT_DIR" not in env_of(container)
    memory = {
        v["name"]
        for v in workload_pod_spec(manifests)["volumes"]
        if v.get("emptyDir", {}).get("medium") == "Memory"
    }
    holders = [
        m["mountPath"]
        for m in container["volumeMounts"]
        if m["name"] in memory and SNAPSHOT_DEFAULT_DIR.is_relative_to(m["mountPath"])
    ]
    assert holders == ["/dev/shm"], container["volumeMounts"]


def test_chart_values_refuses_a_field_no_chart_value_renders() -> None:
    with pytest.raises(KeyError, match=r"ckpt\.collective_timeout_s"):
        chart_values({"ckpt.collective_timeout_s": 3.0})
    assert chart_values({"ckpt.interval_steps": 300}) == {"ckptInterval": 300}
    with pytest.raises(KeyError, match=r"data\.seq_len"):  # the reference model's, not the library's
        chart_values({"data.seq_len": 64})
    both = {"ckpt.interval_steps": 300, "data.seq_len": 64}
    assert reference.chart_values(both) == {"ckptInterval": 300, "seqLen": 64}
