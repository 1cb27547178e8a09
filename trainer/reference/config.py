"""The reference model's own settings: the model size, the token data and the learning rate.

They are the reference entry point's, not the library's: a team's training function reads its own data
its own way and never passes `--data-path`. Declared once with the library's mechanism
(trainer/config/settings.py `setting`), they are parsed from the entry point's arguments (everything
after `--`, `job.args`), refused in one line naming the flag (`config error: seq_len: ...`), and rendered
by the chart after `--` when its `entrypoint` is the reference (`REFERENCE_CHART_TABLE`).

    model  ModelOptions  the preset (trainer/reference/model.py PRESETS)
    data   DataConfig    the token file and the batch shape
    optim  OptimConfig   the AdamW learning rate

Stdlib only (the harnesses build chart values from the table without torch); the checks that need the
presets import them when a config is built.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trainer.config.components import CHART_TABLE
from trainer.config.flags import FlagParser
from trainer.config.settings import ChartRow, ConfigError, add_arguments, chart_rows, check, parsed, setting

if TYPE_CHECKING:
    from trainer.reference.model import ModelConfig

PRESET_NAMES: tuple[str, ...] = ("tiny", "small", "1b", "8b", "70b")
"""The names of trainer/reference/model.py PRESETS (that module imports torch; this one may not): the
choices of --preset and of the chart's `preset`. tests/trainer/reference checks the two agree."""
DATA_FIX = "write one with python -m trainer.reference.data"


@dataclass(frozen=True)
class ModelOptions:
    """Which model: a preset of trainer.reference.model.PRESETS."""

    preset: str = setting(
        "--preset",
        "model size: a preset of trainer/reference/model.py",
        default="8b",
        choices=PRESET_NAMES,
        chart="preset",
    )

    def __post_init__(self) -> None:
        from trainer.reference.model import PRESETS

        if self.preset not in PRESETS:
            raise ConfigError("preset", f"unknown preset {self.preset!r}; choose one of {', '.join(PRESETS)}")


@dataclass(frozen=True)
class DataConfig:
    """The token file and how each rank batches it."""

    path: Path = setting(
        "--data-path",
        "token file (.npy) from python -m trainer.reference.data",
        kind=Path,
        required=True,
        place="DATA_PATH",
    )
    """Token file (.npy) written by `python -m trainer.reference.data`."""
    seq_len: int = setting(
        "--seq-len", "tokens per sequence", default=4096, low=1, high=2**20, chart="seqLen"
    )
    """Bounded by the preset's max_seq_len (checked by ReferenceConfig)."""
    micro_batch_size: int = setting(
        "--micro-batch-size",
        "sequences per rank per step",
        default=1,
        low=1,
        high=65536,
        chart="microBatchSize",
    )
    """Sequences per rank per step (no gradient accumulation)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "path", Path(self.path))
        if not _is_file(self.path):
            what = "does not exist" if not _exists(self.path) else "is not a file"
            raise ConfigError("data_path", f"{self.path} {what} ({DATA_FIX})")
        check(self)


@dataclass(frozen=True)
class OptimConfig:
    """The optimizer (AdamW)."""

    lr: float = setting(
        "--lr",
        "AdamW learning rate",
        default=3e-4,
        above=0,
        why="must be a positive finite number, got {value}",
        chart="lr",
    )

    def __post_init__(self) -> None:
        check(self)


REFERENCE_COMPONENTS: dict[str, type] = {"model": ModelOptions, "data": DataConfig, "optim": OptimConfig}
"""ReferenceConfig's components by field name, in CLI order."""

REFERENCE_CHART_TABLE: tuple[ChartRow, ...] = tuple(chart_rows(REFERENCE_COMPONENTS))
"""Chart value -> reference option -> ReferenceConfig field: what the chart renders after `--` when its
entry point is the reference model."""


@dataclass(frozen=True)
class ReferenceConfig:
    """The reference entry point's settings; construction checks each and the rule between them."""

    data: DataConfig
    model: ModelOptions = field(default_factory=ModelOptions)
    optim: OptimConfig = field(default_factory=OptimConfig)

    def __post_init__(self) -> None:
        max_seq_len = self.arch.max_seq_len
        if not 1 <= self.data.seq_len <= max_seq_len:
            raise ConfigError("seq_len", f"must be in [1, {max_seq_len}] for preset {self.model.preset}")

    @property
    def arch(self) -> ModelConfig:
        """The model's shapes: the preset of `model`."""
        from trainer.reference.model import PRESETS

        return PRESETS[self.model.preset]


def make_parser() -> FlagParser:
    """The reference entry point's options, generated from the declarations above."""
    p = FlagParser(
        prog="python -m trainer [library options] --",
        description="The reference model's options: the arguments after -- when --entrypoint is "
        "trainer.reference:train (the default).",
    )
    for component, cls in REFERENCE_COMPONENTS.items():
        add_arguments(p, component, cls)
    return p


def reference_config(args: Sequence[str]) -> ReferenceConfig:
    """Parse the entry point's arguments into a checked ReferenceConfig; raise ConfigError naming the flag."""
    ns = make_parser().parse_args(list(args))
    values = {name: parsed(ns, name, cls) for name, cls in REFERENCE_COMPONENTS.items()}
    return ReferenceConfig(
        data=DataConfig(**values["data"]),
        model=ModelOptions(**values["model"]),
        optim=OptimConfig(**values["optim"]),
    )


_BY_FIELD = {row.field: row for row in (*CHART_TABLE, *REFERENCE_CHART_TABLE) if not row.is_place}


def chart_values(settings: Mapping[str, Any]) -> dict[str, Any]:
    """Chart values for the library's and the reference model's settings by field (`{"data.seq_len": 64,
    "ckpt.interval_steps": 3}` -> `{"seqLen": 64, "ckptInterval": 3}`): how the harnesses that run the
    reference model build chart values without writing chart keys."""
    unknown = sorted(set(settings) - set(_BY_FIELD))
    if unknown:
        raise KeyError(
            f"no chart value renders {', '.join(unknown)} (trainer/config/components.py CHART_TABLE, "
            "trainer/reference/config.py REFERENCE_CHART_TABLE)"
        )
    return {_BY_FIELD[name].value: value for name, value in settings.items()}


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except OSError:  # e.g. a name longer than the file system allows
        return False


def _exists(path: Path) -> bool:
    try:
        return path.exists()
    except OSError:
        return False
