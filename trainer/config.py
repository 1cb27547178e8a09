"""Typed trainer configuration and its command line, validated before any process group starts.

Every check raises ConfigError(field, why); `python -m trainer` prints it as `config error: <field>: why`
and exits with status 2, so a bad chart value fails in seconds with the field named, instead of after a
rendezvous, a process group and a model build.
"""

from __future__ import annotations

import argparse
import math
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from trainer.checkpoint import config as ckpt_config
from trainer.checkpoint.config import CheckpointConfig
from trainer.errors import UnrecoverableError, error_line
from trainer.faults import FAULT_KINDS, FaultSpec, parse_fault
from trainer.flags import FlagParser
from trainer.inputs import resolved
from trainer.model import PRESETS, ModelConfig
from trainer.resilience.timeouts import TimeoutNestingError, Timeouts
from trainer.snapshot.config import DEFAULT_DIR as SNAPSHOT_DIR
from trainer.snapshot.config import SnapshotConfig

Device = Literal["auto", "cpu", "cuda"]


class ConfigError(UnrecoverableError, ValueError):
    """An invalid configuration value; str() is `config error: <field>: why`, always one line.

    An UnrecoverableError, so one raised after start-up is never retried either (trainer/errors.py).
    """

    def __init__(self, field_name: str, why: str) -> None:
        super().__init__(field_name, why)
        self.args = (error_line(self),)


@dataclass(frozen=True)
class TrainConfig:
    """Everything one training run needs. Construct through `from_args` or directly; both validate."""

    data_path: Path
    """Token file (.npy) written by `python -m trainer.data`."""
    out_dir: Path
    """Events, summary.json and fault markers of this run."""
    ckpt: CheckpointConfig
    """Checkpoint options (trainer/checkpoint/config.py: one definition, validated on construction)."""
    preset: str = "tiny"
    """Model size: one of trainer.model.PRESETS."""
    seq_len: int = 128
    micro_batch_size: int = 4
    """Sequences per rank per step (no gradient accumulation)."""
    steps: int = 100
    """Global steps of the whole run (a resumed run stops at the same step)."""
    lr: float = 3e-4
    seed: int = 1234
    """Seeds model init and data order; the same seed and steps give bitwise the same final state."""
    inprocess: bool = True
    """Tier 1: wrap the loop in nvidia_resiliency_ext.inprocess.Wrapper."""
    timeouts: Timeouts = field(default_factory=Timeouts)
    faults: tuple[FaultSpec, ...] = ()
    fault_seed: int = 0
    """Seed for rank=random in fault specs."""
    metrics_port: int = 0
    """Prometheus port of local rank 0 on every node (trainer/metrics_export.py); 0 disables it."""
    metrics_linger: float = 0.0
    """Seconds a completed run's endpoint waits for one more scrape before the process exits."""
    device: Device = "auto"
    max_repeated_faults: int = 3
    """Tier 1 gives up (leaving the process to ft_launcher) when the same exception hits the same step
    this many times in a row: a deterministic bug, not a transient fault."""
    snapshot: SnapshotConfig = field(default_factory=SnapshotConfig)
    """In-memory snapshots (trainer/snapshot/): the restore point of tier 1 and tier 2."""

    def __post_init__(self) -> None:
        self.validate()

    @property
    def model(self) -> ModelConfig:
        return PRESETS[self.preset]

    def validate(self) -> None:
        """Raise ConfigError naming the first bad field. Touches no process group."""
        if self.preset not in PRESETS:
            raise ConfigError("preset", f"unknown preset {self.preset!r}; choose one of {', '.join(PRESETS)}")
        if not _is_file(self.data_path):
            raise ConfigError(
                "data_path", f"{self.data_path} is not a file (write one with python -m trainer.data)"
            )
        if not 1 <= self.seq_len <= self.model.max_seq_len:
            raise ConfigError("seq_len", f"must be in [1, {self.model.max_seq_len}] for preset {self.preset}")
        for name in ("micro_batch_size", "steps", "max_repeated_faults"):
            if getattr(self, name) < 1:
                raise ConfigError(name, f"must be >= 1, got {getattr(self, name)}")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ConfigError("lr", f"must be a positive finite number, got {self.lr}")
        if self.seed < 0 or self.fault_seed < 0:
            raise ConfigError("seed" if self.seed < 0 else "fault_seed", "must be >= 0")
        if not 0 <= self.metrics_port <= 65535:
            raise ConfigError("metrics_port", f"must be in [0, 65535], got {self.metrics_port}")
        if not (math.isfinite(self.metrics_linger) and self.metrics_linger >= 0):
            raise ConfigError("metrics_linger", f"must be >= 0 seconds, got {self.metrics_linger}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise ConfigError("device", f"must be auto, cpu or cuda, got {self.device!r}")
        if self.device == "cuda":
            import torch

            if not torch.cuda.is_available():
                raise ConfigError("device", "cuda requested but torch sees no GPU")
        for name, value in asdict(self.timeouts).items():  # inf would pass the nesting as the outermost
            if value is not None and not math.isfinite(value):  # None: a derived default
                raise ConfigError(name, f"must be a finite number of seconds, got {value}")
        if self.snapshot.interval_steps < 0:
            raise ConfigError(
                "snapshot_interval", f"must be >= 0 (0 = off), got {self.snapshot.interval_steps}"
            )
        if self.snapshot.enabled and resolved("snapshot_dir", self.snapshot.dir) in (
            resolved("ckpt_dir", self.ckpt.dir),
            *([resolved("ckpt_local_dir", self.ckpt.local_dir)] if self.ckpt.local_dir else []),
        ):
            raise ConfigError("snapshot_dir", "must differ from the checkpoint directories")
        try:
            self.timeouts.check()
        except TimeoutNestingError as exc:
            raise ConfigError(exc.field, exc.message) from None
        for spec in self.faults:
            if spec.step >= self.steps:  # ckpt faults too: the last step always saves (policy.is_due)
                raise ConfigError(
                    "fault", f"{spec} fires at step {spec.step}, the run ends before it ({self.steps})"
                )

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly view for the `run_start` event."""
        out = asdict(self)
        out["faults"] = [str(f) for f in self.faults]
        return _jsonable(out)


def _is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except OSError:  # e.g. a name longer than the file system allows
        return False


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def make_parser() -> argparse.ArgumentParser:
    """The CLI. Option names are fixed: the Helm chart renders them."""
    d = Timeouts()
    p = FlagParser(
        prog="python -m trainer",
        description="FSDP2 LLM trainer with NVRx in-process (tier 1) and ft_launcher (tier 2) recovery.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--preset", default="tiny", help=f"model size: {', '.join(PRESETS)}")
    p.add_argument(
        "--data-path", required=True, type=Path, help="token file (.npy) from python -m trainer.data"
    )
    p.add_argument("--seq-len", type=int, default=128, help="tokens per sequence")
    p.add_argument("--micro-batch-size", type=int, default=4, help="sequences per rank per step")
    p.add_argument("--steps", type=int, default=100, help="global steps of the whole run")
    p.add_argument("--lr", type=float, default=3e-4, help="AdamW learning rate")
    p.add_argument("--seed", type=int, default=1234, help="seed of model init and data order")
    ckpt_config.add_arguments(p)
    p.add_argument(
        "--snapshot-interval",
        type=int,
        default=0,
        help="copy model, optimizer and trainer state into host memory every N steps (0 = off)",
    )
    p.add_argument(
        "--snapshot-dir", type=Path, default=SNAPSHOT_DIR, help="memory-backed dir for the snapshots"
    )
    p.add_argument(
        "--snapshot-replication",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also keep each snapshot on a rank of the next node (needs 2+ nodes)",
    )
    p.add_argument(
        "--out-dir", type=Path, default=Path("out/run"), help="events, summary.json, fault markers"
    )
    p.add_argument(
        "--inprocess", action=argparse.BooleanOptionalAction, default=True, help="tier-1 in-process restart"
    )
    p.add_argument("--collective-timeout", type=float, default=d.collective_timeout, help="seconds")
    p.add_argument("--inprocess-soft-timeout", type=float, default=d.inprocess_soft_timeout, help="seconds")
    p.add_argument("--inprocess-hard-timeout", type=float, default=d.inprocess_hard_timeout, help="seconds")
    p.add_argument(
        "--inprocess-barrier-timeout", type=float, default=d.inprocess_barrier_timeout, help="seconds"
    )
    p.add_argument(
        "--heartbeat-timeout",
        type=float,
        default=d.heartbeat_timeout,
        help="= ft_launcher --ft-rank-heartbeat-timeout",
    )
    p.add_argument(
        "--inprocess-liveness-timeout",
        type=float,
        default=None,
        help="seconds without a peer's Wrapper heartbeat before it counts as dead (lost node); "
        "default: 10 or --inprocess-hard-timeout if shorter",
    )
    p.add_argument(
        "--hang-timeout-floor",
        type=float,
        default=d.hang_timeout_floor,
        help="seconds: the heartbeat timeout calculated from the measured step time is never shorter",
    )
    p.add_argument(
        "--hang-timeout-factor",
        type=float,
        default=d.hang_timeout_factor,
        help="the calculated heartbeat timeout is this times the longest step (saves included)",
    )
    p.add_argument(
        "--hang-warmup-steps",
        type=int,
        default=d.hang_warmup_steps,
        help="steps measured (at least --ckpt-interval + 1) before the calculated heartbeat timeout "
        "replaces --heartbeat-timeout; 0 = never",
    )
    p.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="SPEC",
        help="KIND:step=N[:rank=R|random][:node=K], repeatable; also env TRAINER_FAULTS (';'-separated). "
        "KIND: " + ", ".join(FAULT_KINDS),
    )
    p.add_argument("--fault-seed", type=int, default=0, help="seed for rank=random")
    p.add_argument("--metrics-port", type=int, default=0, help="Prometheus port per node (0 = off)")
    p.add_argument(
        "--metrics-linger", type=float, default=0.0, help="seconds a completed run waits for a last scrape"
    )
    p.add_argument(
        "--max-repeated-faults",
        type=int,
        default=3,
        help="tier 1 gives up when the same exception hits the same step this many times in a row",
    )
    p.add_argument(
        "--device", choices=["auto", "cpu", "cuda"], default="auto", help="auto: cuda if available"
    )
    p.add_argument(
        "--check-config",
        action="store_true",
        help="validate the configuration and exit: 0 when valid, 2 naming the bad field (the chart runs "
        "this as an init container, because ft_launcher would retry a bad config instead of failing)",
    )
    return p


def config_from_args(argv: Sequence[str] | None = None, env: dict[str, str] | None = None) -> TrainConfig:
    """Parse argv (and TRAINER_FAULTS from env) into a validated TrainConfig; raise ConfigError."""
    args = make_parser().parse_args(argv)
    env = dict(os.environ) if env is None else env
    texts = list(args.fault) + [t.strip() for t in env.get("TRAINER_FAULTS", "").split(";") if t.strip()]
    faults = []
    for text in texts:
        try:
            faults.append(parse_fault(text))
        except ValueError as exc:
            raise ConfigError("fault", str(exc)) from None
    try:
        ckpt = ckpt_config.from_args(args, default_dir=args.out_dir / "ckpt")
    except ValueError as exc:
        name, _, why = str(exc).partition(": ")
        raise ConfigError(ckpt_config.cli_field(name), why) from None
    return TrainConfig(
        data_path=args.data_path,
        out_dir=args.out_dir,
        ckpt=ckpt,
        preset=args.preset,
        seq_len=args.seq_len,
        micro_batch_size=args.micro_batch_size,
        steps=args.steps,
        lr=args.lr,
        seed=args.seed,
        inprocess=args.inprocess,
        timeouts=Timeouts(
            collective_timeout=args.collective_timeout,
            inprocess_soft_timeout=args.inprocess_soft_timeout,
            inprocess_hard_timeout=args.inprocess_hard_timeout,
            inprocess_barrier_timeout=args.inprocess_barrier_timeout,
            heartbeat_timeout=args.heartbeat_timeout,
            inprocess_liveness_timeout=args.inprocess_liveness_timeout,
            hang_timeout_floor=args.hang_timeout_floor,
            hang_timeout_factor=args.hang_timeout_factor,
            hang_warmup_steps=args.hang_warmup_steps,
        ),
        faults=tuple(faults),
        fault_seed=args.fault_seed,
        metrics_port=args.metrics_port,
        metrics_linger=args.metrics_linger,
        device=args.device,
        max_repeated_faults=args.max_repeated_faults,
        snapshot=SnapshotConfig(
            interval_steps=args.snapshot_interval,
            dir=args.snapshot_dir,
            replication=args.snapshot_replication,
        ),
    )
