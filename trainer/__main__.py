"""`python -m trainer`: parse and validate the configuration, then run the entry point under the library
(trainer/runtime/entry.py `run`; the tiers are trainer/runtime/train.py)."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

# The in-process Wrapper polls its store with short timeouts; torch's C++ layer logs a warning for every
# poll that times out (tens of lines per second). Keep C++ logs to errors unless the user asks for more.
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status (trainer/runtime/entry.py `run`, with the entry point that
    `--entrypoint` names: the reference model by default)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    options = argv[: argv.index("--")] if "--" in argv else argv
    if "--check-config" not in options:
        from trainer.resilience.verdict import recorded_line

        line = recorded_line(argv, os.environ)
        if line is not None:  # an earlier start of this run met an error no restart can fix: before torch
            from trainer.config.errors import EXIT_NO_RESTART

            print(line, file=sys.stderr)
            return EXIT_NO_RESTART
    from trainer.runtime.entry import run

    return run(argv, recorded_checked=True)


if __name__ == "__main__":
    from trainer.launcher.prefork import SOCKET_ENV  # light: the worker's own imports come after

    if os.environ.get(SOCKET_ENV):  # a warm start: the pod's zygote forks the worker
        from trainer.launcher.prefork.client import run_forked

        forked = run_forked("trainer", sys.argv[1:])
        if forked is not None:
            sys.exit(forked)
    sys.exit(main())
