"""trainer/runtime/entry.py and trainer/api/check.py: `module:function` resolves to the team's training
function or to one `entrypoint` line saying what is wrong; `checked_by` attaches the team's own check, which
`--check-config` runs (one `config error` line, exit 2) like the library's."""

from __future__ import annotations

import itertools
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from trainer.api import check as contract
from trainer.api import checked_by
from trainer.config.settings import ConfigError
from trainer.runtime import entry

# The environment a pod or launcher would set; cleared so the developer's shell cannot leak into a case.
LAUNCH_ENV = (
    "WORLD_SIZE", "GROUP_WORLD_SIZE", "RANK", "LOCAL_RANK", "NNODES", "NPROC_PER_NODE", "MASTER_ADDR",
    "MASTER_PORT", "RDZV_ENDPOINT", "TORCHELASTIC_RUN_ID", "TRAINER_FAULTS", "TRAINER_PG_PORT",
    "TRAINER_INPROCESS_PORT",
)  # fmt: skip
_serial = itertools.count()


@pytest.fixture
def team(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], str]]:
    """Write a throwaway module (source in, its unique name out) on a sys.path entry of this test only."""
    root = tmp_path / "site"
    root.mkdir()
    monkeypatch.syspath_prepend(str(root))
    names: list[str] = []

    def make(source: str) -> str:
        name = f"team_entry_{next(_serial)}_{tmp_path.name.replace('-', '_')}"
        (root / f"{name}.py").write_text(textwrap.dedent(source))
        names.append(name)
        return name

    yield make
    for name in names:
        sys.modules.pop(name, None)


def entrypoint_error(value: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        entry.resolve(value)
    exc = info.value
    assert exc.field == "entrypoint", exc
    assert len(str(exc).splitlines()) == 1 and str(exc).startswith("config error: entrypoint: "), exc
    return exc


# ---- resolve -------------------------------------------------------------------------------------------


def test_module_function_resolves(team: Callable[[str], str]) -> None:
    name = team("def go(job):\n    return ('went', job)\n\ndef train(job):\n    return job\n")
    fn = entry.resolve(f"{name}:go")
    assert fn.__name__ == "go" and fn(1) == ("went", 1)
    assert sys.modules[name].go is fn


def test_bare_module_means_train(team: Callable[[str], str]) -> None:
    name = team("def train(job):\n    return 'train'\n\ndef other(job):\n    return 'other'\n")
    assert entry.resolve(name)(None) == "train"


def test_reference_entry_point_resolves() -> None:
    from trainer import reference

    assert entry.resolve("trainer.reference:train") is reference.train
    assert entry.resolve("trainer.reference") is reference.train


@pytest.mark.parametrize(
    "signature", ["job", "job, extra=1", "*args", "job, *rest, flag=False, **kw", "job, /"]
)
def test_one_argument_signatures_resolve(team: Callable[[str], str], signature: str) -> None:
    name = team(f"def train({signature}):\n    return 'ok'\n")
    assert entry.resolve(name)(object()) == "ok"


def test_a_callable_object_resolves(team: Callable[[str], str]) -> None:
    name = team("class T:\n    def __call__(self, job):\n        return job\n\ntrain = T()\n")
    assert entry.resolve(name)(5) == 5


def test_missing_module() -> None:
    exc = entrypoint_error("no_such_team_module_x:train")
    assert "no module no_such_team_module_x in this image" in exc.why
    assert "install the team's code into the image" in exc.why


def test_missing_submodule_of_an_existing_package() -> None:
    exc = entrypoint_error("trainer.no_such_part:train")
    assert "no module trainer.no_such_part in this image (trainer.no_such_part not found)" in exc.why


def test_module_whose_dependency_is_missing(team: Callable[[str], str]) -> None:
    name = team("import no_such_dependency_y\n\ndef train(job):\n    pass\n")
    exc = entrypoint_error(f"{name}:train")
    assert exc.why.startswith(f"importing {name} failed: ModuleNotFoundError: "), exc
    assert "no_such_dependency_y" in exc.why


@pytest.mark.parametrize(
    ("source", "shown"),
    [
        ("raise RuntimeError('bad config\\nsecond line')\n", "RuntimeError: bad config"),
        ("x = 1 / 0\n", "ZeroDivisionError: division by zero"),
        ("def train(job):\n    pass\n)\n", "SyntaxError: "),
        ("raise KeyError('k')\n", "KeyError: 'k'"),
    ],
)
def test_module_that_raises_at_import(team: Callable[[str], str], source: str, shown: str) -> None:
    name = team(source)
    exc = entrypoint_error(f"{name}:train")
    assert exc.why.startswith(f"importing {name} failed: {shown}"), exc
    assert "second line" not in str(exc)


def test_missing_attribute(team: Callable[[str], str]) -> None:
    name = team("def train(job):\n    pass\n")
    assert entrypoint_error(f"{name}:trian").why == f"{name} has no trian"
    bare = team("def main(job):\n    pass\n")
    assert entrypoint_error(bare).why == f"{bare} has no train"


def test_not_callable(team: Callable[[str], str]) -> None:
    name = team("train = 3\nconfig = {'a': 1}\n")
    assert entrypoint_error(name).why == f"{name}:train is a int, not a function"
    assert entrypoint_error(f"{name}:config").why == f"{name}:config is a dict, not a function"


@pytest.mark.parametrize("signature", ["", "job, model", "*, job", "job, *, strict"])
def test_function_must_take_one_argument(team: Callable[[str], str], signature: str) -> None:
    name = team(f"def train({signature}):\n    pass\n")
    exc = entrypoint_error(f"{name}:train")
    assert exc.why == f"{name}:train({signature}) must take one argument, the Job", exc


@pytest.mark.parametrize("value", ["", "a b", "team:train:extra", "-m", "1team", "team.:x", "téam"])
def test_malformed_entrypoint(value: str) -> None:
    exc = entrypoint_error(value)
    assert "must be module or module:function" in exc.why


# ---- checked_by ----------------------------------------------------------------------------------------


def test_checked_by_attaches_the_check() -> None:
    calls: list[object] = []

    def check(cfg: object, world: object) -> None:
        calls.append((cfg, world))

    @checked_by(check)
    def train(job: object) -> None:
        pass

    def plain(job: object) -> None:
        pass

    assert contract.entry_check(train) is check
    assert contract.entry_check(plain) is None
    plain.__trainer_check__ = "not callable"  # type: ignore[attr-defined]
    assert contract.entry_check(plain) is None
    assert train.__name__ == "train"  # the function itself, marked: not a wrapper


def test_checked_by_survives_resolve(team: Callable[[str], str]) -> None:
    name = team(
        """
        from trainer.api import checked_by

        def check(cfg, world):
            pass

        @checked_by(check)
        def train(job):
            pass
        """
    )
    fn = entry.resolve(name)
    assert contract.entry_check(fn) is sys.modules[name].check


# ---- --check-config with a team's entry point ---------------------------------------------------------


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in LAUNCH_ENV:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def check_config(argv: list[str], capsys: pytest.CaptureFixture[str], out: Path) -> tuple[int, str, str]:
    # No --data-path, --preset or --seq-len: a team's entry point needs no reference-model option.
    options = [f"--out-dir={out}", "--device=cpu", "--steps=7", "--check-config"]
    status = entry.run([*options, *argv])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


CHECKED_TEAM = """
from trainer.api import ConfigError, JobConfig, World, checked_by

SEEN = []

def check(cfg: JobConfig, world: World) -> None:
    SEEN.append((cfg.args, cfg.steps, world.world_size))
    if cfg.args[:1] == ("--bad",):
        raise ConfigError("team_data", "x")

@checked_by(check)
def train(job):
    raise AssertionError("--check-config must not train")
"""


def test_check_config_runs_the_teams_check_and_fails_in_one_line(
    team: Callable[[str], str],
    clean_env: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    name = team(CHECKED_TEAM)
    clean_env.setenv("NNODES", "2")
    clean_env.setenv("NPROC_PER_NODE", "4")
    status, out, err = check_config(
        [f"--entrypoint={name}:train", "--", "--bad", "y"], capsys, tmp_path / "out"
    )
    assert status == 2, (out, err)
    assert err.splitlines() == ["config error: team_data: x"], err
    assert out == ""
    assert sys.modules[name].SEEN == [(("--bad", "y"), 7, 8)]


def test_check_config_with_a_valid_team_entry_point(
    team: Callable[[str], str],
    clean_env: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    name = team(CHECKED_TEAM)
    status, out, err = check_config([f"--entrypoint={name}:train", "--", "--good"], capsys, tmp_path / "out")
    assert status == 0, (out, err)
    lines = out.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"config ok: entry point {name}:train, 7 steps"), out
    assert "preset" not in lines[0]
    assert sys.modules[name].SEEN == [(("--good",), 7, None)]
    assert "Traceback" not in err


def test_check_config_with_an_unchecked_team_entry_point(
    team: Callable[[str], str],
    clean_env: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    name = team("def train(job):\n    raise AssertionError('--check-config must not train')\n")
    status, out, err = check_config([f"--entrypoint={name}"], capsys, tmp_path / "out")
    assert status == 0, (out, err)
    assert out.startswith(f"config ok: entry point {name}, 7 steps"), out


@pytest.mark.parametrize(
    ("source", "text"),
    [
        (None, "no module"),
        ("raise RuntimeError('boom')\n", "failed: RuntimeError: boom"),
        ("def train():\n    pass\n", "must take one argument"),
    ],
)
def test_check_config_with_a_bad_entry_point(
    team: Callable[[str], str],
    clean_env: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    source: str | None,
    text: str,
) -> None:
    name = "no_such_team_module_z" if source is None else team(source)
    status, out, err = check_config([f"--entrypoint={name}:train"], capsys, tmp_path / "out")
    assert status == 2, (out, err)
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("config error: entrypoint: ") and text in lines[0], err
    assert out == ""
