"""What is retried and what is not: the unrecoverable-error record and the repeated-fault bound.

An UnrecoverableError ends the process with exit status 93. ft_launcher >= 0.7 with
`--ft-no-restart-exit-code 93` then stops; 0.4.1 has no such code and restarts the workers anyway (checked:
its agent restarts any failed group while restarts remain, whatever the exit status). So that a restart
costs no second start on any version, the failing rank records the error in `<out-dir>/unrecoverable.json`
and every worker checks for it before it builds anything: a restarted worker prints the recorded line and
exits 93 again at once, before it imports torch. The record is keyed by the launcher's run id, the
command line, the size and mtime of every file the entry point's arguments name (its data: the reference
model's `--data-path`, a team's own files) and the checkpoint listing, so it no longer applies once the
user changes any of them (a new token file, another flag, deleted checkpoints); deleting the file clears
it by hand. A command line without --out-dir records nothing (the chart always passes one).

`RepeatGuard` bounds restart storms that no classification foresaw: the same exception at the same step
`limit` times in a row makes tier 1 give up and leave the process to ft_launcher.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import stat
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from trainer.config.errors import UnrecoverableError, error_line

RECORD_NAME = "unrecoverable.json"


@dataclass(frozen=True)
class RunIdentity:
    """The run as its command line names it. Read from argv, not from TrainConfig: a restarted worker
    checks the record before importing torch (seconds per restart on a loaded host)."""

    argv: tuple[str, ...]
    out_dir: Path
    inputs: tuple[Path, ...]
    """What the entry point's arguments (after `--`) may name as a file: `--flag=PATH` or a bare PATH."""
    ckpt_dir: Path

    @classmethod
    def from_argv(cls, argv: Sequence[str]) -> RunIdentity | None:
        """None when the command line names no --out-dir (nothing to record into)."""
        argv = list(argv)
        cut = argv.index("--") if "--" in argv else len(argv)
        parser = argparse.ArgumentParser(add_help=False, exit_on_error=False)
        for flag in ("--out-dir", "--ckpt-dir"):
            parser.add_argument(flag, type=Path)
        try:
            known, _ = parser.parse_known_args(argv[:cut])
        except (argparse.ArgumentError, SystemExit):
            return None
        if known.out_dir is None:
            return None
        ckpt = known.ckpt_dir if known.ckpt_dir is not None else known.out_dir / "ckpt"
        inputs = tuple(Path(a.partition("=")[2] if a.startswith("-") else a) for a in argv[cut + 1 :])
        return cls(tuple(argv), known.out_dir, tuple(p for p in inputs if str(p) not in ("", ".")), ckpt)

    @property
    def record_path(self) -> Path:
        return self.out_dir / RECORD_NAME

    def key(self, env: Mapping[str, str]) -> str:
        """What an unrecoverable error depends on: run id, flags, faults, input files, checkpoints."""
        data = []
        for path in self.inputs:
            try:
                st = path.stat()
            except (OSError, ValueError):  # not a path at all (an option's plain value), or gone
                continue
            if not stat.S_ISREG(st.st_mode):  # a directory's mtime moves while the run writes into it
                continue
            data.append([str(path), st.st_size, st.st_mtime_ns])
        try:  # dot files are other ranks' write probes (trainer/runtime/preflight.py), not checkpoints
            ckpts = sorted(p.name for p in self.ckpt_dir.iterdir() if not p.name.startswith("."))
        except OSError:
            ckpts = []
        facts = {
            "run_id": env.get("TORCHELASTIC_RUN_ID", ""),
            "argv": list(self.argv),
            "faults": env.get("TRAINER_FAULTS", ""),
            "data": data,
            "ckpts": ckpts,
        }
        return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()


def record_unrecoverable(
    argv: Sequence[str], exc: UnrecoverableError, rank: int, env: Mapping[str, str]
) -> None:
    """Write the record (atomically; the first one stays). Only under a launcher: nothing else restarts."""
    run = RunIdentity.from_argv(argv)
    if "TORCHELASTIC_RUN_ID" not in env or run is None:
        return
    record = {"key": run.key(env), "line": error_line(exc), "rank": rank, "time": time.time()}
    tmp = run.record_path.with_name(f".{RECORD_NAME}.{os.getpid()}")
    try:
        run.out_dir.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(record) + "\n", encoding="utf-8")
        if not run.record_path.exists():
            tmp.replace(run.record_path)
    except OSError:
        pass  # the exit status still says it; only a 0.4.1 restart costs one more start
    with contextlib.suppress(OSError):  # e.g. the out-dir is a file (the error being recorded)
        tmp.unlink(missing_ok=True)


def recorded_line(argv: Sequence[str], env: Mapping[str, str]) -> str | None:
    """The line to print when an earlier start of this same run recorded an unrecoverable error."""
    run = RunIdentity.from_argv(argv)
    if "TORCHELASTIC_RUN_ID" not in env or run is None:
        return None
    try:
        record = json.loads(run.record_path.read_text(encoding="utf-8"))
        if record["key"] != run.key(env):
            return None
        return (
            f"{record['line']} (found by rank {record['rank']}; not retried: "
            f"delete {run.record_path} to retry unchanged)"
        )
    except (OSError, ValueError, KeyError, TypeError):
        return None


@dataclass
class RepeatGuard:
    """Consecutive failures of this rank with the same exception (type, first line) at the same step."""

    limit: int
    last: tuple[str, str, int] | None = None
    count: int = 0

    def repeated(self, exc: BaseException, step: int) -> bool:
        """Record a failure; True once the same one has happened `limit` times in a row."""
        lines = str(exc).strip().splitlines()
        signature = (type(exc).__name__, lines[0][:300] if lines else "", step)
        self.count = self.count + 1 if signature == self.last else 1
        self.last = signature
        return self.count >= self.limit

    def describe(self) -> str:
        kind, text, step = self.last or ("?", "", -1)
        where = f"at step {step}" if step >= 0 else "before the first step"
        return (
            f"in-process restarts stopped: {kind}: {text} {where}, {self.count} times in a row "
            "(a deterministic error, not a transient fault; --max-repeated-faults); "
            "leaving the process to ft_launcher"
        )
