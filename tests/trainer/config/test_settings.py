"""The declaration mechanism (trainer/config/settings.py): the generated CLI carries every component's
defaults, bounds name the option, the one derived setting cannot disagree, and the configuration layer
imports without torch and without a cycle."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT
from trainer.checkpoint.config import CheckpointConfig
from trainer.config.components import COMPONENTS, MetricsConfig, RunConfig
from trainer.config.settings import declared, dest
from trainer.config.train_config import ConfigError, TrainConfig, config_from_args, make_parser
from trainer.reference.config import OptimConfig
from trainer.resilience.timeouts import DEFAULT_LIVENESS_TIMEOUT, Timeouts


def test_generated_options_default_to_the_declared_defaults() -> None:
    defaults = {a.dest: a.default for a in make_parser()._actions}
    checked = 0
    for component, cls in COMPONENTS.items():
        for f, spec in declared(cls):
            if spec.flag is None or spec.required or spec.repeat:
                continue
            want = None if f.default is dataclasses.MISSING else f.default
            assert defaults[dest(component, f)] == want, (component, f.name)
            checked += 1
    assert checked >= 30, checked
    (liveness,) = [a for a in make_parser()._actions if "--inprocess-liveness-timeout" in a.option_strings]
    assert liveness.default == DEFAULT_LIVENESS_TIMEOUT
    assert "at most --inprocess-hard-timeout" in str(liveness.help)


@pytest.mark.parametrize(
    ("build", "line"),
    [
        (lambda: RunConfig(steps=0), "config error: steps: must be >= 1, got 0"),
        (lambda: RunConfig(seed=-1), "config error: seed: must be >= 0"),
        (lambda: OptimConfig(lr=float("nan")), "config error: lr: must be a positive finite number, got nan"),
        (lambda: MetricsConfig(port=70000), "config error: metrics_port: must be in [0, 65535], got 70000"),
        (lambda: MetricsConfig(linger=-1.0), "config error: metrics_linger: must be >= 0 seconds, got -1.0"),
        (
            lambda: CheckpointConfig(dir=Path("/c"), interval_steps=0),
            "config error: ckpt_interval: must be an integer >= 1",
        ),
        (
            lambda: CheckpointConfig(dir=Path("/c"), interval_steps=True),
            "config error: ckpt_interval: must be an integer",
        ),
        (
            lambda: CheckpointConfig(dir=Path("/c"), write_timeout_s=0.0),
            "config error: ckpt_write_timeout: must be > 0 seconds",
        ),
    ],
)
def test_bounds_name_the_option(build: object, line: str) -> None:
    with pytest.raises(ConfigError) as info:
        build()  # type: ignore[operator]
    assert str(info.value).startswith(line), str(info.value)


def test_the_checkpoint_collective_timeout_is_derived_not_overwritten() -> None:
    argv = ["--out-dir", "/tmp/unused-out", "--collective-timeout=7"]
    argv += ["--inprocess-soft-timeout=8", "--inprocess-hard-timeout=11", "--inprocess-barrier-timeout=12"]
    cfg = config_from_args(argv, env={})
    assert cfg.ckpt.collective_timeout_s == cfg.timeouts.collective_timeout == 7.0
    assert "--ckpt-collective-timeout" not in make_parser().format_help()  # derived: no option
    with pytest.raises(ConfigError, match=r"^config error: collective_timeout: the checkpoint"):
        TrainConfig(ckpt=CheckpointConfig(dir=Path("/c")), timeouts=Timeouts(7, 8, 11, 12, 300))


def test_the_configuration_layer_imports_without_torch_or_a_cycle() -> None:
    code = (
        "import sys; import trainer.config.flags; "
        "assert 'trainer.config.train_config' not in sys.modules, 'flags -> config'; "
        "import trainer.config.components, trainer.reference.config; "
        "assert 'trainer.reference.model' not in sys.modules, 'the chart table needs no model'; "
        "bad = [m for m in sys.modules if m.split('.')[0] in "
        "('torch', 'tools', 'bench', 'infra')]; print(bad); sys.exit(bool(bad))"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
