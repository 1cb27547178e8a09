"""tools/podcommand.py: the pod command the tests and benchmarks run is the chart's, with only the places
that name the cluster swapped for local ones."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.chart.helm import env_of, render, trainer_container
from tools.podcommand import (
    LOCAL_VALUES,
    LocalPlaces,
    RenderError,
    launcher_argv,
    pod_argv,
    split_entry_args,
    trainer_argv,
    with_options,
)
from tools.podspec import expand

VALUES = {
    "preset": "tiny",
    "seqLen": 32,
    "steps": 12,
    "ckptMode": "sync",
    "maxRestarts": 6,
    "faults": {"a": "sigkill:step=7:rank=1"},
}
PLACES = LocalPlaces(4321, Path("/data/t.npy"), Path("/runs/r1"))


def test_pod_argv_is_the_rendered_command_with_local_places() -> None:
    rendered = trainer_container(render({**LOCAL_VALUES, **VALUES}, release="local", namespace="local"))
    raw = [*rendered["command"], *rendered["args"]]
    got = pod_argv(VALUES, PLACES)
    # The one argument a local run adds: a snapshot directory of its own (a pod's is the trainer's
    # default in its /dev/shm), given to the trainer first.
    added = got.index("trainer") + 1
    assert got.pop(added) == "--snapshot-dir=/runs/r1-shm"
    assert len(got) == len(raw)
    # The chart's default wraps the launcher in the prefork wrapper; both run from this virtualenv.
    assert raw[:4] == ["python", "-m", "trainer.launcher", "ft_launcher"]
    assert got[0] == sys.executable and got[1:3] == ["-m", "trainer.launcher"]
    assert Path(got[3]).name == "ft_launcher"
    assert Path(got[3]).is_file(), "ft_launcher must come from this virtualenv"
    assert launcher_argv(got)[0] == got[3]
    # Every other argument is the rendered one; a $(VAR) reference is expanded from the pod's env with
    # only the local places replaced.
    env = {**env_of(rendered), **PLACES.env()}
    for before, after in zip(raw[4:], got[4:], strict=True):
        assert after == expand(before, env)
        if "$(" not in before:
            assert after == before
    assert "--rdzv-endpoint=127.0.0.1:4321" in got
    assert "--out-dir=/runs/r1" in got and "--ckpt-dir=/runs/r1/ckpt" in got
    assert "--ckpt-local-dir=/runs/r1-local" in got and "--max-restarts=6" in got
    assert "--fault=sigkill:step=7:rank=1" in got and "--metrics-port=0" in got and "--device=cpu" in got
    # The entry point is among the trainer's options, then the reference model's own options (the default
    # entry point) after `--`, its data the local one.
    options, entry = split_entry_args(got)
    assert "--entrypoint=trainer.reference:train" in options[options.index("trainer") :]
    assert entry == [
        "--data-path=/data/t.npy",
        "--preset=tiny",
        "--seq-len=32",
        "--micro-batch-size=1",
        "--lr=0.0003",
    ]


def test_without_prefork_the_launcher_is_the_command() -> None:
    got = pod_argv({**VALUES, "preforkWorkers": False}, PLACES)
    assert Path(got[0]).name == "ft_launcher" and Path(got[0]).is_file()
    assert launcher_argv(got) == got
    assert got[1:] == pod_argv(VALUES, PLACES)[4:]


def test_trainer_argv_is_the_part_after_the_launcher() -> None:
    full = pod_argv(VALUES, PLACES)
    part = trainer_argv(VALUES, PLACES)
    assert part[:2] == ["-m", "trainer"] and full[-len(part) :] == part
    assert "--steps=12" in part and not any(a.startswith("--rdzv") for a in part)


def test_values_the_chart_rejects_stop_with_helms_message() -> None:
    # The chart checks that the timeouts nest; the builder surfaces its message, it does not run.
    with pytest.raises(RenderError, match="collectiveTimeout"):
        pod_argv({"collectiveTimeout": 500, "inprocessSoftTimeout": 5}, PLACES)


# The entry point's own arguments: some look like YAML of another type, one like a $(VAR) reference.
ENTRY_ARGS = ["--config", "team.yaml", "yes", "010", "", "a b", "$(OUT_DIR)", "$$", "--", "é中"]


def test_the_entry_point_and_its_arguments_come_last_exactly_as_written() -> None:
    values = {**VALUES, "entrypoint": "team.train:main", "entrypointArgs": ENTRY_ARGS}
    got = pod_argv(values, PLACES)
    options, entry = split_entry_args(got)
    assert entry == ENTRY_ARGS
    assert got == [*options, "--", *ENTRY_ARGS]
    # Every trainer option stays before the cut, the chart's own appended ones included; a team's entry
    # point gets no reference-model option.
    assert "--entrypoint=team.train:main" in options[options.index("trainer") :]
    assert "--fault=sigkill:step=7:rank=1" in options and "--out-dir=/runs/r1" in options
    assert not any(a.startswith(("--data-path", "--preset", "--seq-len", "--lr")) for a in options)
    part = trainer_argv(values, PLACES)
    assert part[:2] == ["-m", "trainer"] and part[-len(ENTRY_ARGS) - 1 :] == ["--", *ENTRY_ARGS]
    # A team's entry point without entrypointArgs: no cut at all.
    plain = pod_argv({**VALUES, "entrypoint": "team.train:main"}, PLACES)
    assert "--" not in plain and split_entry_args(plain) == (plain, [])
    # The reference entry point (the default): its own options, then the entrypointArgs.
    reference = pod_argv({**VALUES, "entrypointArgs": ["--lr=0.001"]}, PLACES)
    assert "--entrypoint=trainer.reference:train" in reference
    assert split_entry_args(reference)[1][0] == "--data-path=/data/t.npy"
    assert split_entry_args(reference)[1][-2:] == ["--lr=0.0003", "--lr=0.001"]  # the last one wins


def test_options_added_to_a_local_run_stay_the_trainers() -> None:
    argv = pod_argv(VALUES, PLACES)
    options, entry = split_entry_args(argv)
    got = with_options(argv, ["--steps=3", "--fault=hang:step=1"])
    # The trainer refuses a flag given twice: an option replaces the chart's own, a fault adds to them.
    kept = [a for a in options if a != "--steps=12"]
    assert len(kept) == len(options) - 1 and "--fault=sigkill:step=7:rank=1" in kept
    assert got == [*kept, "--steps=3", "--fault=hang:step=1", "--", *entry]
    team = pod_argv({**VALUES, "entrypoint": "team.train:main"}, PLACES)
    assert with_options(team, ["--steps=3"]) == [*(a for a in team if a != "--steps=12"), "--steps=3"]


def test_an_unexpanded_reference_in_the_options_is_still_an_error() -> None:
    # Only the entry point's arguments may hold a literal `$(`: a trainer option with one is a mistake.
    with pytest.raises(RenderError, match="unexpanded"):
        pod_argv({**VALUES, "extraTrainerArgs": ["--snapshot-dir=$(NO_SUCH_VAR)"]}, PLACES)
