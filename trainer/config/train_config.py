"""Typed trainer configuration and its command line, validated before any process group starts.

`TrainConfig` composes one config per component (trainer/config/components.py); each declares its settings
once (trainer/config/settings.py), and the CLI is generated from those declarations. Every check raises
ConfigError(field, why); `python -m trainer` prints it as `config error: <field>: why` and exits with
status 2, so a bad chart value fails in seconds with the field named, instead of after a rendezvous, a
process group and a model build.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from trainer.checkpoint.config import CheckpointConfig
from trainer.config.components import COMPONENTS, FaultConfig, MetricsConfig, RunConfig
from trainer.config.flags import FlagParser
from trainer.config.inputs import resolved
from trainer.config.settings import ConfigError, add_arguments, parsed
from trainer.resilience.guard import GuardConfig
from trainer.resilience.timeouts import TimeoutNestingError, Timeouts
from trainer.runtime.faults import IN_SAVE_KINDS, FaultSpec, parse_fault
from trainer.snapshot.config import SnapshotConfig
from trainer.state.cadence import next_due

__all__ = ["ConfigError", "TrainConfig", "config_from_args", "make_parser"]


@dataclass(frozen=True)
class TrainConfig:
    """Everything one training run needs: one config per component. Construct through
    `config_from_args` or directly; both validate (each component on its own, the rules between
    components here)."""

    ckpt: CheckpointConfig
    """Checkpoint options; its collective timeout is derived from `timeouts` (see config_from_args)."""
    run: RunConfig = field(default_factory=RunConfig)
    timeouts: Timeouts = field(default_factory=Timeouts)
    snapshot: SnapshotConfig = field(default_factory=SnapshotConfig)
    """In-memory snapshots (trainer/snapshot/): the restore point of tier 1 and tier 2."""
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    faults: FaultConfig = field(default_factory=FaultConfig)
    guard: GuardConfig = field(default_factory=GuardConfig)
    """The numerical guard (trainer/resilience/guard.py)."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ConfigError naming the first bad field. Touches no process group."""
        if self.run.device == "cuda":
            import torch

            if not torch.cuda.is_available():
                raise ConfigError("device", "cuda requested but torch sees no GPU")
        for name, value in asdict(self.timeouts).items():  # inf would pass the nesting as the outermost
            if value is not None and not math.isfinite(value):  # None: a derived default
                raise ConfigError(name, f"must be a finite number of seconds, got {value}")
        if self.snapshot.enabled and resolved("snapshot_dir", self.snapshot.dir) in (
            resolved("ckpt_dir", self.ckpt.dir),
            *([resolved("ckpt_local_dir", self.ckpt.local_dir)] if self.ckpt.local_dir else []),
        ):
            raise ConfigError("snapshot_dir", "must differ from the checkpoint directories")
        try:
            self.timeouts.check()
        except TimeoutNestingError as exc:
            raise ConfigError(exc.field, exc.message) from None
        if self.ckpt.collective_timeout_s != self.timeouts.collective_timeout:
            raise ConfigError(
                "collective_timeout",
                f"the checkpoint's groups must use it too (got {self.ckpt.collective_timeout_s}); "
                "compose with CheckpointConfig(..., collective_timeout_s=timeouts.collective_timeout)",
            )
        for spec in self.faults.specs:
            if fault_fires_at(spec, self.run.steps, self.ckpt.interval_steps) is None:
                raise ConfigError(
                    "fault", f"{spec} fires at step {spec.step}, the run ends before it ({self.run.steps})"
                )

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly view for the `run_start` event."""
        out = asdict(self)
        out["faults"]["specs"] = [str(f) for f in self.faults.specs]
        return _jsonable(out)


def fault_fires_at(spec: FaultSpec, steps: int, ckpt_interval: int) -> int | None:
    """The step at which `spec` fires in a run of `steps` steps, or None when the run ends first.

    In-save faults fire in the first save at or after their step (`trainer.state.cadence.next_due`, the
    last step always saves); the others at the start of their step. The chart refuses the same specs at render
    time (k8s/templates/_validate.tpl `trainer.requireReachableFaults`).
    """
    if spec.kind in IN_SAVE_KINDS:
        return next_due(spec.step, ckpt_interval, steps - 1)
    return spec.step if spec.step < steps else None


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def make_parser() -> argparse.ArgumentParser:
    """The CLI, generated from the component declarations. Option names are fixed: the chart renders them."""
    p = FlagParser(
        prog="python -m trainer",
        description="FSDP2 LLM trainer with NVRx in-process (tier 1) and ft_launcher (tier 2) recovery.",
        epilog="Arguments after a literal -- go to the entry point untouched (job.args; "
        "docs/bring-your-own.md).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    for component, cls in COMPONENTS.items():
        add_arguments(p, component, cls)
    p.add_argument(
        "--check-config",
        action="store_true",
        help="validate the configuration and exit: 0 when valid, 2 naming the bad field (the chart runs "
        "this as an init container, because ft_launcher would retry a bad config instead of failing)",
    )
    return p


def split_entry_args(argv: Sequence[str]) -> tuple[list[str], tuple[str, ...]]:
    """(the trainer's options, the entry point's arguments): everything after the first `--` is the
    team's, passed through untouched (never parsed as a trainer option)."""
    argv = list(argv)
    if "--" not in argv:
        return argv, ()
    cut = argv.index("--")
    return argv[:cut], tuple(argv[cut + 1 :])


def config_from_args(argv: Sequence[str] | None = None, env: dict[str, str] | None = None) -> TrainConfig:
    """Parse argv (and TRAINER_FAULTS from env) into a validated TrainConfig; raise ConfigError."""
    argv, entry_args = split_entry_args(sys.argv[1:] if argv is None else argv)
    args = make_parser().parse_args(argv)
    env = dict(os.environ) if env is None else env
    values = {name: parsed(args, name, cls) for name, cls in COMPONENTS.items()}
    values["run"]["entry_args"] = entry_args
    texts = list(values["faults"]["specs"])
    texts += [t.strip() for t in env.get("TRAINER_FAULTS", "").split(";") if t.strip()]
    faults = []
    for text in texts:
        try:
            faults.append(parse_fault(text))
        except ValueError as exc:
            raise ConfigError("fault", str(exc)) from None
    values["faults"]["specs"] = tuple(faults)
    run = RunConfig(**values["run"])
    if values["ckpt"]["dir"] is None:
        values["ckpt"]["dir"] = run.out_dir / "ckpt"
    timeouts = Timeouts(**values["timeouts"])
    return TrainConfig(
        # The one derived setting: the checkpoint's gloo groups time out with the training collectives.
        ckpt=CheckpointConfig(**values["ckpt"], collective_timeout_s=timeouts.collective_timeout),
        run=run,
        timeouts=timeouts,
        snapshot=SnapshotConfig(**values["snapshot"]),
        metrics=MetricsConfig(**values["metrics"]),
        faults=FaultConfig(**values["faults"]),
        guard=GuardConfig(**values["guard"]),
    )
