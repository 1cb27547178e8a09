"""The one checkpoint configuration: a validated dataclass whose fields declare their own options.

Each field's option, default, bounds, help and chart value are written once, here, with
`trainer.config.settings.setting`; the trainer's `--ckpt-*` options are generated from them
(trainer/config/train_config.py), so the CLI cannot drift from the manager's defaults. Errors name the option
(`ckpt_interval: ...`). Stdlib only: `--check-config` imports this in an init container, before (and
without) torch.distributed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from trainer.config.settings import WEEK_S, ConfigError, check, setting

CkptMode = Literal["nvrx", "torch-async", "sync"]
MODES: tuple[str, ...] = ("nvrx", "torch-async", "sync")
_AT_LEAST_ONE = "must be an integer >= 1, got {value!r}"


@dataclass(frozen=True)
class CheckpointConfig:
    """Where and how often to checkpoint, how to resume, and how long any checkpoint wait may block."""

    dir: Path = setting(
        "--ckpt-dir", "shared checkpoint dir (default: OUT_DIR/ckpt)", kind=Path, place="CHECKPOINT_DIR"
    )
    """Shared checkpoint directory (FSx on the cluster): committed checkpoints live here."""
    local_dir: Path | None = setting(
        "--ckpt-local-dir",
        "node-local checkpoint tier, drained to --ckpt-dir",
        default=None,
        kind=Path,
        place="LOCAL_CHECKPOINT_DIR",
    )
    """Node-local tier (the node's NVMe): each save is written and sealed here first, then drained to `dir`,
    where it is committed (trainer/checkpoint/local_tier.py). None: saves go to `dir` directly."""
    interval_steps: int = setting(
        "--ckpt-interval",
        "save every N steps",
        default=100,
        low=1,
        high=10**12,
        why=_AT_LEAST_ONE,
        chart="ckptInterval",
    )
    """Save after every step s with (s + 1) % interval_steps == 0 (steps are 0-based), and after the last
    step of the run whatever the interval (trainer/state/cadence.py `is_due`)."""
    keep_latest: int = setting(
        "--ckpt-keep",
        "committed checkpoints to keep",
        default=3,
        low=1,
        high=10**6,
        why=_AT_LEAST_ONE,
        chart="ckptKeep",
    )
    """Loadable checkpoints of this model kept; older ones of this model are deleted after each commit."""
    mode: CkptMode = setting("--ckpt-mode", "save path", default="nvrx", choices=MODES, chart="ckptMode")
    """nvrx: NVRx persistent worker process; torch-async: dcp.async_save (thread); sync: dcp.save."""
    write_timeout_s: float = setting(
        "--ckpt-write-timeout",
        "seconds a save may take before it counts as failed",
        default=600.0,
        above=0,
        high=WEEK_S,
        unit=" seconds",
        chart="ckptWriteTimeout",
    )
    """Upper bound on any wait for a background write; past it the save fails (a `ckpt_failed` event)."""
    failure_limit: int = setting(
        "--ckpt-failure-limit",
        "consecutive failed saves after which training stops",
        default=3,
        low=1,
        high=10**6,
        why=_AT_LEAST_ONE,
        chart="ckptFailureLimit",
    )
    """A failed save is reported and training goes on (the next interval saves again); this many failures
    in a row stop the run: storage that keeps failing would otherwise lose ever more steps."""
    allow_fresh_start: bool = setting(
        "--allow-fresh-start",
        "train from scratch when committed checkpoints exist but none of them loads",
        default=False,
        chart="allowFreshStart",
    )
    """Without it, a directory with committed checkpoints of which none loads stops the run before
    training (exit status 2, one line per checkpoint with the reason): silently starting over would
    throw away the run and, through retention, its checkpoints."""
    collective_timeout_s: float = setting(
        None, "timeout of the checkpoint's own gloo groups", default=60.0, above=0, unit=" seconds"
    )
    """Timeout of the checkpoint's own gloo groups. No option: a training run derives it from
    `Timeouts.collective_timeout` when it composes its configuration (trainer/config/train_config.py, one
    place)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "dir", Path(self.dir))
        if self.local_dir is not None:
            object.__setattr__(self, "local_dir", Path(self.local_dir))
            try:
                same = Path(self.local_dir).resolve() == Path(self.dir).resolve()
            except RuntimeError:  # Path.resolve's symlink loop: one line, not a traceback
                loop = f"{self.local_dir} or {self.dir} is a symlink loop"
                raise ConfigError("ckpt_local_dir", loop) from None
            if same:
                raise ConfigError("ckpt_local_dir", "must differ from dir")
        check(self)
