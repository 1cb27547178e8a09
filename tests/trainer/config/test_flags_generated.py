"""Generated trainer flags: the project's own valid flag sets, mutated (types, whitespace, newlines, unicode,
boundaries, nan/inf, huge ints, repeated, abbreviated, missing and unknown flags), each run through the entry
point with --check-config. Every result is either a clean rejection (exit 2, one `config error: <field>: ...`
line naming a known field, no traceback) or an acceptance whose configuration holds the value exactly as
written. A seeded generator of our own (no new dependency): the same cases every run, printed on failure.
"""

from __future__ import annotations

import math
import os
import random
import re
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import REPO_ROOT
from tests.trainer._reference import with_reference_last

SEED = 20261130
MUTATIONS_PER_FLAG = 12
LAUNCH_ENV = (
    "WORLD_SIZE",
    "GROUP_WORLD_SIZE",
    "RANK",
    "NNODES",
    "NPROC_PER_NODE",
    "MASTER_PORT",
    "RDZV_ENDPOINT",
    "TORCHELASTIC_RUN_ID",
    "TRAINER_FAULTS",
    "TRAINER_PG_PORT",
    "TRAINER_INPROCESS_PORT",
)


@dataclass(frozen=True)
class Flag:
    """One trainer flag: how to read it back from its config (`configs`: the library's TrainConfig and
    the reference entry point's components) and what kind of value it takes."""

    name: str
    kind: str  # int, float, path, choice, fault
    read: Callable[[Any], Any]
    choices: tuple[str, ...] = ()


FLAGS = [
    Flag("--preset", "choice", lambda c: c.model.preset, ("tiny", "small", "1b", "8b", "70b")),
    Flag("--data-path", "path", lambda c: c.data.path),
    Flag("--seq-len", "int", lambda c: c.data.seq_len),
    Flag("--micro-batch-size", "int", lambda c: c.data.micro_batch_size),
    Flag("--steps", "int", lambda c: c.run.steps),
    Flag("--lr", "float", lambda c: c.optim.lr),
    Flag("--seed", "int", lambda c: c.run.seed),
    Flag("--ckpt-dir", "path", lambda c: c.ckpt.dir),
    Flag("--ckpt-local-dir", "path", lambda c: c.ckpt.local_dir),
    Flag("--ckpt-interval", "int", lambda c: c.ckpt.interval_steps),
    Flag("--ckpt-keep", "int", lambda c: c.ckpt.keep_latest),
    Flag("--ckpt-mode", "choice", lambda c: c.ckpt.mode, ("nvrx", "torch-async", "sync")),
    Flag("--out-dir", "path", lambda c: c.run.out_dir),
    Flag("--collective-timeout", "float", lambda c: c.timeouts.collective_timeout),
    Flag("--inprocess-soft-timeout", "float", lambda c: c.timeouts.inprocess_soft_timeout),
    Flag("--inprocess-hard-timeout", "float", lambda c: c.timeouts.inprocess_hard_timeout),
    Flag("--inprocess-barrier-timeout", "float", lambda c: c.timeouts.inprocess_barrier_timeout),
    Flag("--heartbeat-timeout", "float", lambda c: c.timeouts.heartbeat_timeout),
    Flag("--fault", "fault", lambda c: c.faults.specs),
    Flag("--fault-seed", "int", lambda c: c.faults.seed),
    Flag("--metrics-port", "int", lambda c: c.metrics.port),
    Flag("--max-repeated-faults", "int", lambda c: c.run.max_repeated_faults),
    Flag("--device", "choice", lambda c: c.run.device, ("auto", "cpu", "cuda")),
]
BY_NAME = {f.name: f for f in FLAGS}


def valid_sets(data: Path, out: Path) -> list[list[tuple[str, str]]]:
    """The project's own valid flag sets: the test suite's short CPU run and the chart's defaults."""
    tests_run = [
        ("--preset", "tiny"),
        ("--data-path", str(data)),
        ("--seq-len", "32"),
        ("--micro-batch-size", "2"),
        ("--steps", "10"),
        ("--ckpt-interval", "3"),
        ("--ckpt-keep", "3"),
        ("--ckpt-mode", "sync"),
        ("--out-dir", str(out)),
        ("--device", "cpu"),
        ("--seed", "11"),
        ("--collective-timeout", "3"),
        ("--inprocess-soft-timeout", "5"),
        ("--inprocess-hard-timeout", "30"),
        ("--inprocess-barrier-timeout", "40"),
        ("--heartbeat-timeout", "60"),
        ("--fault", "exception:step=3:rank=1"),
    ]
    chart_defaults = [
        ("--data-path", str(data)),
        ("--ckpt-dir", str(out / "ckpt")),
        ("--ckpt-local-dir", str(out / "nvme")),
        ("--out-dir", str(out)),
        ("--preset", "tiny"),
        ("--seq-len", "128"),
        ("--micro-batch-size", "4"),
        ("--steps", "100"),
        ("--lr", "0.0003"),
        ("--seed", "1234"),
        ("--ckpt-interval", "10"),
        ("--ckpt-keep", "3"),
        ("--ckpt-mode", "nvrx"),
        ("--collective-timeout", "120"),
        ("--inprocess-soft-timeout", "180"),
        ("--inprocess-hard-timeout", "300"),
        ("--inprocess-barrier-timeout", "420"),
        ("--heartbeat-timeout", "600"),
        ("--fault-seed", "0"),
        ("--metrics-port", "0"),
        ("--max-repeated-faults", "3"),
        ("--device", "cpu"),
    ]
    return [tests_run, chart_defaults]


WEIRD = [
    "\n",
    "\r\n",
    "\t",
    " ",
    "\u00a0",
    "\u2028",
    "é",
    "Ω",
    "😀",
    "\u200b",
    "#",
    "'",
    '"',
    "$(X)",
    "\\",
    "-",
]
INT_VALUES = [
    "0",
    "1",
    "-1",
    "2",
    "00012",
    "-0",
    "+5",
    " 5",
    "5 ",
    "5\n",
    "1_000",
    "1e3",
    "3.0",
    "0x10",
    "\uff15",
    "١٢",
    "",
    "five",
    str(2**31),
    str(2**63 - 1),
    str(2**63),
    str(-(2**63) - 1),
    str(10**30),
    "512",
    "513",
    "65535",
    "65536",
    "9" * 400,
]
FLOAT_VALUES = [
    "nan",
    "NaN",
    "-nan",
    "inf",
    "-inf",
    "Infinity",
    "1e999",
    "-1e999",
    "1e308",
    "1e-320",
    "0",
    "-0.0",
    ".5",
    "5.",
    "1_0.5",
    "٣",
    "3,5",
    " 2",
    "2\n",
    "1e",
    "e5",
    "0x1p3",
    "",
    "1e-3",
    "3E2",
    "+7.25",
    "1" * 400,
]
FAULT_VALUES = [
    "exception:step=3",
    "exception:step=3\n",
    "exception:step=\uff13",
    "exception:step=1_0",
    "exception:step=-1",
    "exception:rank=1",
    "exception:step=3:rank=random",
    "exception:step=3:rank=",
    ":",
    "",
    "exception:step=99999999999999999999999",
    "sigkill:step=2:node=0",
    "ckpt-crash:step=1",
    "hang:step=1:rank=1:rank=2",
    "EXCEPTION:step=1",
    "exception: step=2 ",
    "exception:step=2;x",
    "repeat-exception:step=4",
]


def mutate_value(flag: Flag, current: str, rng: random.Random, tmp: Path) -> str:
    """A value for `flag`: a hand-picked hard case, or the current value with unusual text spliced in."""
    if rng.random() < 0.35:
        pos = rng.randrange(len(current) + 1)
        return current[:pos] + rng.choice(WEIRD) + current[pos:]
    if flag.kind == "int":
        return rng.choice([*INT_VALUES, str(rng.randint(-10, 10**6))])
    if flag.kind == "float":
        return rng.choice([*FLOAT_VALUES, repr(rng.uniform(1e-6, 1e4))])
    if flag.kind == "choice":
        return rng.choice(
            [*flag.choices, current.upper(), current + "\n", "", current + " ", "tïny", "cpu,cuda"]
        )
    if flag.kind == "fault":
        return rng.choice(FAULT_VALUES)
    base = rng.choice(
        [tmp / "gen", tmp / "gen with space", tmp / "génér/ätéd", tmp / ("x" * 300), Path("rel/dir")]
    )
    return rng.choice([str(base), str(base) + "/", str(base) + "\n", "", ".", str(tmp / "missing.npy")])


@dataclass(frozen=True)
class Case:
    name: str
    argv: list[str]
    flag: Flag | None = None
    value: str | None = None


def generate(data: Path, out: Path, tmp: Path) -> list[Case]:
    rng = random.Random(SEED)
    cases: list[Case] = []
    for set_index, pairs in enumerate(valid_sets(data, out)):
        present = dict(pairs)
        for flag in FLAGS:
            current = present.get(flag.name, "1")
            for k in range(MUTATIONS_PER_FLAG):
                value = mutate_value(flag, current, rng, tmp)
                kept = [(n, v) for n, v in pairs if n != flag.name]
                groups = [[f"{n}={v}"] for n, v in kept]
                groups.append([f"{flag.name}={value}"] if rng.random() < 0.5 else [flag.name, value])
                rng.shuffle(groups)  # order must not matter; `--flag value` stays one group
                argv = [arg for group in groups for arg in group]
                cases.append(Case(f"set{set_index}{flag.name}#{k}={value!r}", argv, flag, value))
        flat = [f"{n}={v}" for n, v in pairs]
        cases += [
            Case(f"set{set_index}:as is", flat),
            Case(f"set{set_index}:unknown flag", [*flat, "--no-such-flag=1"]),
            Case(f"set{set_index}:flag without value", [*flat, "--steps"]),
            Case(f"set{set_index}:missing --data-path", [a for a in flat if not a.startswith("--data-path")]),
            Case(f"set{set_index}:repeated --steps (refused)", [*flat, "--steps=7", "--steps=9"]),
            Case(f"set{set_index}:ambiguous prefix", [*flat, "--ckpt=3"]),
            Case(f"set{set_index}:unique prefix (refused)", [*flat, "--ckpt-inter=3"]),
            Case(f"set{set_index}:positional", [*flat, "extra"]),
            Case(f"set{set_index}:bool flag with value", [*flat, "--inprocess=yes"]),
            Case(f"set{set_index}:empty argument", [*flat, ""]),
        ]
    return cases


def configs(argv: list[str]) -> Any:
    """The library's config and the reference entry point's, as one namespace of components."""
    from types import SimpleNamespace

    from trainer.config.train_config import config_from_args
    from trainer.reference.config import reference_config

    cfg = config_from_args(with_reference_last(argv), env={})
    ref = reference_config(cfg.run.entry_args)
    return SimpleNamespace(**vars(cfg), model=ref.model, data=ref.data, optim=ref.optim)


def known_fields() -> set[str]:
    """Field names a rejection may name: config dataclass fields and every option's name."""
    from trainer.config.components import COMPONENTS
    from trainer.config.train_config import TrainConfig, make_parser
    from trainer.reference import config as reference

    classes = (TrainConfig, *COMPONENTS.values(), reference.ReferenceConfig)
    names = {f.name for cls in (*classes, *reference.REFERENCE_COMPONENTS.values()) for f in fields(cls)}
    actions = [*make_parser()._actions, *reference.make_parser()._actions]
    options = {a.dest for a in actions} | {
        o.lstrip("-").replace("-", "_") for a in actions for o in a.option_strings
    }
    return names | options | {"fault", "arguments"}


def assert_as_written(flag: Flag, value: str, got: Any) -> None:
    """An accepted value is the value the user wrote (no silent coercion of other notations)."""
    if flag.kind == "int":
        assert value.isascii() and re.fullmatch(r"-?[0-9]+", value) and got == int(value), (value, got)
    elif flag.kind == "float":
        assert value.isascii() and math.isfinite(got) and got == float(value), (value, got)
        assert re.fullmatch(r"[+-]?[0-9.eE+-]+", value), value
    elif flag.kind == "choice":
        assert got == value
    elif flag.kind == "path":
        assert got == Path(value)
    else:
        from trainer.runtime.faults import parse_fault

        assert value.isascii() and not any(ch in value for ch in "\n\r\t")
        assert [str(f) for f in got] == [str(parse_fault(value))]


@pytest.fixture(scope="module")
def gen_tokens(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from trainer.reference.data import write_synthetic_tokens

    return write_synthetic_tokens(tmp_path_factory.mktemp("gen") / "tokens.npy", 50_000, 2048, seed=5)


def test_generated_flag_sets_are_rejected_in_one_line_or_kept_as_written(
    gen_tokens: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from trainer.__main__ import main

    for name in LAUNCH_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)  # relative paths land here
    cases = generate(gen_tokens, tmp_path / "out", tmp_path)
    fields_known = known_fields()
    accepted = rejected = 0
    for case in cases:
        status = main(with_reference_last([*case.argv, "--check-config"]))
        out, err = capsys.readouterr()
        where = f"case {case.name}: argv {case.argv!r}\nstdout {out!r}\nstderr {err!r}"
        assert status in (0, 2), where
        assert "Traceback" not in err, where
        if status == 2:
            rejected += 1
            assert err.endswith("\n") and err.count("\n") == 1, where
            match = re.match(r"config error: ([a-z_]+): \S", err)
            assert match and match.group(1) in fields_known, where
            continue
        accepted += 1
        assert out.startswith("config ok: ") and out.count("\n") == 1, where
        if case.flag is not None and case.value is not None:
            assert_as_written(case.flag, case.value, case.flag.read(configs(case.argv)))
    # Both outcomes occur in bulk: a generator that only produced rejections would prove nothing.
    assert accepted >= 50 and rejected >= 200, (accepted, rejected)
    assert not (tmp_path / "out").exists(), "--check-config created the output directory"


def test_generated_cases_through_the_real_command_line(gen_tokens: Path, tmp_path: Path) -> None:
    """A few generated rejections as real processes (argv bytes, stderr encoding, exit status)."""
    picks = ["--seq-len=١٢", "--out-dir=" + str(tmp_path / "é\nx")]
    base = [f"--data-path={gen_tokens}", f"--out-dir={tmp_path / 'out'}", "--device=cpu", "--check-config"]
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_ENV}
    for pick in picks:
        proc = subprocess.run(
            [sys.executable, "-m", "trainer", *with_reference_last([*base, pick])],
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
        )
        lines = [ln for ln in proc.stderr.splitlines() if ln.strip() and "pynvml" not in ln]
        if proc.returncode == 0:  # an out-dir with a newline is a legal path name: accepted
            assert proc.stdout.startswith("config ok: ") and proc.stdout.count("\n") == 1, proc.stdout
            continue
        assert proc.returncode == 2, proc.stderr
        assert lines and lines[-1].startswith("config error: ") and "Traceback" not in proc.stderr, (
            proc.stderr
        )


def _options() -> list[tuple[str, str, bool, bool]]:
    """(option, dest, repeatable, takes a value) of every long option of the trainer's parser."""
    import argparse

    from trainer.config.train_config import make_parser

    repeatable = (argparse._AppendAction, argparse._CountAction, argparse._HelpAction)
    return [
        (o, a.dest, isinstance(a, repeatable), a.nargs != 0)
        for a in make_parser()._actions
        for o in a.option_strings
        if o.startswith("--")
    ]


def test_every_flag_given_twice_is_refused_naming_it(
    gen_tokens: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every option (and its --no- twin) given a second time stops in one line naming its field, whatever
    the values; only the options that add up (--fault) may repeat. argparse alone keeps the last."""
    from trainer.__main__ import main

    for name in LAUNCH_ENV:
        monkeypatch.delenv(name, raising=False)
    rng = random.Random(SEED)
    base = {"--out-dir": str(tmp_path / "out"), "--device": "cpu"}
    reference = ["--", f"--data-path={gen_tokens}"]  # the default entry point's own options
    by_dest: dict[str, list[tuple[str, bool]]] = {}
    for option, dest, repeatable, takes_value in _options():
        if not repeatable and option != "--check-config":
            by_dest.setdefault(dest, []).append((option, takes_value))
    assert len(by_dest) > 20
    for _dest, names in sorted(by_dest.items()):
        given = [rng.choice(names), rng.choice(names)]
        written = [f"{o}={rng.choice(['1', '0.5', 'x'])}" if v else o for o, v in given]
        kept = [f"{k}={v}" for k, v in base.items() if k not in (given[0][0], given[1][0])]
        status = main([*kept, *written, "--check-config", *reference])
        _, err = capsys.readouterr()
        where = f"{written}: {err!r}"
        assert status == 2 and err.count("\n") == 1, where
        field = names[0][0].lstrip("-").replace("-", "_")
        assert err.startswith(f"config error: {field}: given twice"), where
    # --fault adds up: two are two faults, not a repeat
    from trainer.config.train_config import config_from_args

    argv = [
        *(f"{k}={v}" for k, v in base.items()),
        "--fault=exception:step=3",
        "--fault=sigkill:step=5",
        *reference,
    ]
    assert len(config_from_args(argv, env={}).faults.specs) == 2


def test_every_abbreviation_of_a_flag_is_refused(
    gen_tokens: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A prefix of an option that is no option itself is refused (argparse would expand `--ste` to
    `--steps`), naming the argument; sampled, two per option."""
    from trainer.__main__ import main

    for name in LAUNCH_ENV:
        monkeypatch.delenv(name, raising=False)
    rng = random.Random(SEED)
    names = {o for o, _, _, _ in _options()}
    base = [f"--out-dir={tmp_path / 'out'}", "--device=cpu", "--check-config"]
    reference = ["--", f"--data-path={gen_tokens}"]  # the default entry point's own options
    tried = 0
    for option in sorted(names):
        prefixes = [option[:n] for n in range(4, len(option)) if option[:n] not in names]
        for prefix in rng.sample(prefixes, min(2, len(prefixes))):
            status = main([*base, f"{prefix}=1", *reference])
            _, err = capsys.readouterr()
            assert status == 2 and err.startswith("config error: arguments: unrecognized"), (prefix, err)
            assert f"{prefix}=1" in err, (prefix, err)
            tried += 1
    assert tried > 40
