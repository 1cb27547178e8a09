"""The one checkpoint configuration: a validated dataclass, and the command-line options generated from it.

Each field's default and help text are written once, here; `add_arguments` turns the fields into the
trainer's `--ckpt-*` options and `from_args` reads them back, so the CLI cannot drift from the manager's
defaults. Errors name the field (`interval_steps: ...`); `cli_field` maps it to the option's name for
the trainer's `config error: ckpt_interval: ...` line. Stdlib only: `--check-config` imports this in an
init container, before (and without) torch.distributed.
"""

from __future__ import annotations

import argparse
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

CkptMode = Literal["nvrx", "torch-async", "sync"]
MODES: tuple[str, ...] = ("nvrx", "torch-async", "sync")


def _opt(flag: str, help: str, **kw: Any) -> dict[str, Any]:
    return {"cli": flag, "help": help, **kw}


@dataclass(frozen=True)
class CheckpointConfig:
    """Where and how often to checkpoint, how to resume, and how long any checkpoint wait may block."""

    dir: Path = field(metadata=_opt("--ckpt-dir", "shared checkpoint dir (default: OUT_DIR/ckpt)"))
    """Shared checkpoint directory (FSx on the cluster): committed checkpoints live here."""
    local_dir: Path | None = field(
        default=None, metadata=_opt("--ckpt-local-dir", "node-local checkpoint tier, drained to --ckpt-dir")
    )
    """Node-local tier (the node's NVMe): each save is written and sealed here first, then drained to `dir`,
    where it is committed (trainer/checkpoint/local_tier.py). None: saves go to `dir` directly."""
    interval_steps: int = field(default=10, metadata=_opt("--ckpt-interval", "save every N steps"))
    """Save after every step s with (s + 1) % interval_steps == 0 (steps are 0-based), and after the last
    step of the run whatever the interval."""
    keep_latest: int = field(default=3, metadata=_opt("--ckpt-keep", "committed checkpoints to keep"))
    """Loadable checkpoints of this model kept; older ones of this model are deleted after each commit."""
    mode: CkptMode = field(default="nvrx", metadata=_opt("--ckpt-mode", "save path", choices=MODES))
    """nvrx: NVRx persistent worker process; torch-async: dcp.async_save (thread); sync: dcp.save."""
    write_timeout_s: float = field(
        default=600.0,
        metadata=_opt("--ckpt-write-timeout", "seconds a save may take before it counts as failed"),
    )
    """Upper bound on any wait for a background write; past it the save fails (a `ckpt_failed` event)."""
    failure_limit: int = field(
        default=3,
        metadata=_opt("--ckpt-failure-limit", "consecutive failed saves after which training stops"),
    )
    """A failed save is reported and training goes on (the next interval saves again); this many failures
    in a row stop the run: storage that keeps failing would otherwise lose ever more steps."""
    allow_fresh_start: bool = field(
        default=False,
        metadata=_opt(
            "--allow-fresh-start",
            "train from scratch when committed checkpoints exist but none of them loads",
            action=argparse.BooleanOptionalAction,
        ),
    )
    """Without it, a directory with committed checkpoints of which none loads stops the run before
    training (exit status 2, one line per checkpoint with the reason): silently starting over would
    throw away the run and, through retention, its checkpoints."""
    collective_timeout_s: float = 60.0
    """Timeout of the checkpoint's own gloo groups (the trainer sets the training collective timeout)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "dir", Path(self.dir))
        if self.local_dir is not None:
            object.__setattr__(self, "local_dir", Path(self.local_dir))
            try:
                same = Path(self.local_dir).resolve() == Path(self.dir).resolve()
            except RuntimeError:  # Path.resolve's symlink loop: one line, not a traceback
                raise ValueError(f"local_dir: {self.local_dir} or {self.dir} is a symlink loop") from None
            if same:
                raise ValueError("local_dir: must differ from dir")
        for name in ("interval_steps", "keep_latest", "failure_limit"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}: must be an integer >= 1, got {value!r}")
        if self.mode not in MODES:
            raise ValueError(f"mode: must be one of {', '.join(MODES)}, got {self.mode!r}")
        for name in ("write_timeout_s", "collective_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name}: must be > 0 seconds, got {getattr(self, name)!r}")


def _cli_fields() -> list[Any]:
    return [f for f in fields(CheckpointConfig) if "cli" in f.metadata]


def cli_field(name: str) -> str:
    """The option behind a field, as the trainer's error line names it (interval_steps -> ckpt_interval)."""
    for f in _cli_fields():
        if f.name == name:
            return str(f.metadata["cli"]).lstrip("-").replace("-", "_")
    return name


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add one option per field (defaults and help from the dataclass; --ckpt-dir defaults to None)."""
    types = {"dir": Path, "local_dir": Path, "mode": str, "interval_steps": int, "keep_latest": int}
    types["failure_limit"] = int
    for f in _cli_fields():
        kw = {k: v for k, v in f.metadata.items() if k != "cli"}
        if "action" not in kw:
            kw["type"] = types.get(f.name, float)
        kw["default"] = None if f.default is MISSING else f.default
        parser.add_argument(f.metadata["cli"], dest=f"ckpt_{f.name}", **kw)


def from_args(args: argparse.Namespace, default_dir: Path) -> CheckpointConfig:
    """The validated config from parsed options; raises ValueError naming the field."""
    values = {f.name: getattr(args, f"ckpt_{f.name}") for f in _cli_fields()}
    if values["dir"] is None:
        values["dir"] = default_dir
    return CheckpointConfig(**values)
