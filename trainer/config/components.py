"""The trainer's components and their settings, each declared once (trainer/config/settings.py).

    run       RunConfig       where the run writes, how long it trains, seeds, device, tier 1
    timeouts  Timeouts        trainer/resilience/timeouts.py: every recovery timeout, checked to nest
    ckpt      CheckpointConfig  trainer/checkpoint/config.py
    snapshot  SnapshotConfig  trainer/snapshot/config.py
    metrics   MetricsConfig   the Prometheus endpoint
    faults    FaultConfig     injected faults (trainer/runtime/faults.py)
    guard     GuardConfig     trainer/resilience/guard.py: the numerical guard

`TrainConfig` (trainer/config/train_config.py) holds one of each; the CLI is generated from them in this
order, and `CHART_TABLE` lists, from the same declarations, which chart value renders which option into which
field. Stdlib only: the harnesses (tools/, bench/) import this to build chart values without torch.

The model, its data and its optimizer are the training function's: the reference model declares its own
(trainer/reference/config.py), parsed from the entry point's arguments, so a team's function needs none.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, fields
from pathlib import Path
from typing import Any, Literal

from trainer.checkpoint.config import CheckpointConfig
from trainer.config.settings import EXACT_INT, WEEK_S, ChartRow, ConfigError, chart_rows, check, setting
from trainer.resilience.guard import GuardConfig
from trainer.resilience.straggler_policy import POLICIES, StragglerPolicy
from trainer.resilience.timeouts import Timeouts
from trainer.runtime.faults import FAULT_KINDS, FaultSpec
from trainer.snapshot.config import SnapshotConfig

REFERENCE_ENTRYPOINT = "trainer.reference:train"
"""The entry point `python -m trainer` runs by default: the reference Llama-style model, one API user."""
ENTRYPOINT_PATTERN = re.compile(
    r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*(:[A-Za-z_][A-Za-z0-9_]*)?"
)
"""`package.module` or `package.module:function`: ASCII identifiers only (the chart's schema agrees)."""
ENTRYPOINT_MAX = 200


def check_entrypoint(value: object) -> None:
    """One line naming the field for anything that is not `module[:function]` (checked before import)."""
    if not isinstance(value, str) or not ENTRYPOINT_PATTERN.fullmatch(value) or len(value) > ENTRYPOINT_MAX:
        raise ConfigError(
            "entrypoint",
            f"must be module or module:function (ASCII identifiers, at most {ENTRYPOINT_MAX} characters), "
            f"got {value!r:.80}",
        )


Device = Literal["auto", "cpu", "cuda"]
DEVICES: tuple[str, ...] = ("auto", "cpu", "cuda")


@dataclass(frozen=True)
class RunConfig:
    """The run as a whole: output, length, seeds, device and tier-1 recovery."""

    out_dir: Path = setting(
        "--out-dir", "events, summary.json, fault markers", default=Path("out/run"), place="OUT_DIR"
    )
    """Events, summary.json and fault markers of this run."""
    steps: int = setting(
        "--steps", "global steps of the whole run", default=1000, low=1, high=10**12, chart="steps"
    )
    """Global steps of the whole run (a resumed run stops at the same step)."""
    seed: int = setting(
        "--seed",
        "seed of model init and data order",
        default=1234,
        low=0,
        high=EXACT_INT,
        why="must be >= 0",
        chart="seed",
    )
    """Seeds model init and data order; the same seed and steps give bitwise the same final state."""
    device: Device = setting(
        "--device",
        "auto: cuda if available",
        default="auto",
        choices=DEVICES,
        chart="device",
    )
    inprocess: bool = setting("--inprocess", "tier-1 in-process restart", default=True, chart="inprocess")
    """Tier 1: wrap the loop in nvidia_resiliency_ext.inprocess.Wrapper."""
    max_repeated_faults: int = setting(
        "--max-repeated-faults",
        "tier 1 gives up when the same exception hits the same step this many times in a row",
        default=3,
        low=1,
        high=1000,
        chart="maxRepeatedFaults",
    )
    """Tier 1 gives up (leaving the process to ft_launcher) when the same exception hits the same step
    this many times in a row: a deterministic bug, not a transient fault."""
    entrypoint: str = setting(
        "--entrypoint",
        "the training function, module:function (a bare module means module:train); "
        "arguments after -- go to it untouched",
        default=REFERENCE_ENTRYPOINT,
        pattern=ENTRYPOINT_PATTERN.pattern,
        max_length=ENTRYPOINT_MAX,
        chart="entrypoint",
    )
    """The team's training function (trainer/api): called with a `Job` once per attempt."""
    straggler_policy: StragglerPolicy = setting(
        "--straggler-policy",
        "a node slower than its peers for a window: report it, or evict it into a hot spare (only when one "
        "stands by)",
        default="evict",
        choices=POLICIES,
        chart="stragglerPolicy",
    )
    """What a straggler finding does (trainer/resilience/straggler.py): `report` (an event, a metric, a
    report line) or `evict` (the same, then its pod leaves and a hot spare takes its place; without a
    spare standing by, or within a window of the last eviction, it reports only)."""
    entry_args: tuple[str, ...] = setting(
        None, "the arguments after --, for the entry point", factory=tuple, kind=tuple
    )
    """Derived from the command line: everything after `--`, handed to the entry point as `job.args`."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "out_dir", Path(self.out_dir))
        object.__setattr__(self, "entry_args", tuple(self.entry_args))
        check_entrypoint(self.entrypoint)  # its own message first: what the form is, not the pattern
        check(self)
        for i, arg in enumerate(self.entry_args):
            if not isinstance(arg, str) or "\0" in arg:
                raise ConfigError("entry_args", f"argument {i} must be a string without NUL, got {arg!r:.60}")


@dataclass(frozen=True)
class MetricsConfig:
    """The Prometheus endpoint of local rank 0 on every node (trainer/events/metrics_export.py)."""

    port: int = setting(
        "--metrics-port",
        "Prometheus port per node (0 = off)",
        default=9400,
        low=0,
        high=65535,
        chart="metricsPort",
    )
    linger: float = setting(
        "--metrics-linger",
        "seconds a completed run waits for a last scrape",
        default=60.0,
        low=0,
        high=WEEK_S,
        unit=" seconds",
        chart="metricsLinger",
    )
    """Seconds a completed run's endpoint waits for one more scrape before the process exits."""

    def __post_init__(self) -> None:
        check(self)


@dataclass(frozen=True)
class FaultConfig:
    """Faults to inject (off by default): `--fault` specs and the seed of rank=random."""

    specs: tuple[FaultSpec, ...] = setting(
        "--fault",
        "KIND:step=N[:rank=R|random][:node=K][:factor=F], repeatable; "
        "also env TRAINER_FAULTS (';'-separated). "
        "KIND: " + ", ".join(FAULT_KINDS),
        factory=tuple,
        repeat=True,
        metavar="SPEC",
        chart="faults",
    )
    """Parsed specs (trainer/runtime/faults.py); the chart renders its `faults` map as one --fault per
    entry."""
    seed: int = setting(
        "--fault-seed",
        "seed for rank=random",
        default=0,
        low=0,
        high=EXACT_INT,
        why="must be >= 0",
        chart="faultSeed",
    )

    def __post_init__(self) -> None:
        object.__setattr__(self, "specs", tuple(self.specs))
        check(self)


COMPONENTS: dict[str, type] = {
    "run": RunConfig,
    "timeouts": Timeouts,
    "ckpt": CheckpointConfig,
    "snapshot": SnapshotConfig,
    "metrics": MetricsConfig,
    "faults": FaultConfig,
    "guard": GuardConfig,
}
"""TrainConfig's components by field name, in CLI order."""

CHART_TABLE: tuple[ChartRow, ...] = tuple(chart_rows(COMPONENTS))
"""Chart value -> trainer option -> TrainConfig field, for every option the chart renders."""
_BY_FIELD = {row.field: row for row in CHART_TABLE if not row.is_place}


def default_of(name: str) -> Any:
    """The declared default of a setting by TrainConfig field (`"ckpt.interval_steps"` -> its default): how
    a harness takes the cluster's value without writing it again."""
    component, _, field_name = name.partition(".")
    for f in fields(COMPONENTS[component]):
        if f.name == field_name:
            return f.default_factory() if f.default_factory is not MISSING else f.default
    raise KeyError(f"no setting {name} (trainer/config/components.py COMPONENTS)")


def chart_values(settings: Mapping[str, Any]) -> dict[str, Any]:
    """Chart values for settings given by TrainConfig field (`{"ckpt.interval_steps": 3}` ->
    `{"ckptInterval": 3}`): how the harnesses build chart values without writing chart keys."""
    unknown = sorted(set(settings) - set(_BY_FIELD))
    if unknown:
        raise KeyError(
            f"no chart value renders {', '.join(unknown)} (trainer/config/components.py CHART_TABLE)"
        )
    return {_BY_FIELD[name].value: value for name, value in settings.items()}
