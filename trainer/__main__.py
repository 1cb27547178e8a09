"""`python -m trainer`: parse and validate the configuration, then train (see trainer/train.py)."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence

# The in-process Wrapper polls its store with short timeouts; torch's C++ layer logs a warning for every
# poll that times out (tens of lines per second). Keep C++ logs to errors unless the user asks for more.
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")

from trainer.errors import EXIT_CONFIG, EXIT_NO_RESTART, UnrecoverableError, error_line


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status.

    A configuration or input error prints one `config error: <field>: why` line and exits 2 in
    `--check-config` or without a launcher, 93 (ft_launcher's no-restart code) under one.
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    check_only = "--check-config" in argv
    final = EXIT_NO_RESTART if "TORCHELASTIC_RUN_ID" in os.environ and not check_only else EXIT_CONFIG
    from trainer.verdict import recorded_line

    line = None if check_only else recorded_line(argv, os.environ)
    if line is not None:  # an earlier start of this run met an error no restart can fix
        print(line, file=sys.stderr)
        return EXIT_NO_RESTART
    from trainer.config import config_from_args  # imports torch (the model presets)

    try:
        from trainer.inputs import check_env

        check_env(os.environ)  # before the config: its timeouts read two of these settings
        cfg = config_from_args(argv)
        from trainer.preflight import preflight

        world = preflight(cfg, os.environ, check_config=check_only)
    except UnrecoverableError as exc:
        print(error_line(exc), file=sys.stderr)
        if final == EXIT_NO_RESTART:  # a 0.4.1 ft_launcher relaunches anyway: the record ends those at once
            from trainer.verdict import record_unrecoverable

            record_unrecoverable(argv, exc, int(os.environ.get("RANK", "0") or 0), os.environ)
        return final
    if check_only:
        ranks = f"{world.world_size} ranks" if world.world_size else "world size not known here"
        print(
            error_line_safe(
                f"config ok: preset {cfg.model.preset}, {cfg.run.steps} steps, {ranks}, data {cfg.data.path}"
            )
        )
        return 0
    logging.basicConfig(
        level=os.environ.get("TRAINER_LOG_LEVEL", "WARNING"),
        format=f"%(asctime)s rank{os.environ.get('RANK', '0')} %(name)s %(levelname)s %(message)s",
    )
    from trainer.train import main as train_main  # torch.distributed imports only after validation

    try:
        return train_main(cfg)
    except UnrecoverableError as exc:  # raised before the loop (e.g. the metrics port taken meanwhile)
        print(error_line(exc), file=sys.stderr)
        from trainer.verdict import record_unrecoverable

        record_unrecoverable(argv, exc, int(os.environ.get("RANK", "0") or 0), os.environ)
        return EXIT_NO_RESTART


def error_line_safe(text: str) -> str:
    """`text` with unprintable characters escaped (a path may hold any byte but NUL and '/')."""
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text)


if __name__ == "__main__":
    from trainer.launcher.prefork import SOCKET_ENV  # light: the worker's own imports come after

    if os.environ.get(SOCKET_ENV):  # a warm start: the pod's zygote forks the worker
        from trainer.launcher.prefork.client import run_forked

        forked = run_forked("trainer", sys.argv[1:])
        if forked is not None:
            sys.exit(forked)
    sys.exit(main())
