"""`main`: a team's script run under the library.

`python -m trainer --entrypoint=team.train:main ... -- <team args>` (what the chart renders) and a team
script ending in `api.main(train)` run the same code (trainer/runtime/entry.py `run`): parse and check the
library's options, resolve and check the function, preflight, then train under both recovery tiers.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import NoReturn

from trainer.api.job import TrainFn


def main(train: TrainFn, argv: Sequence[str] | None = None) -> NoReturn:
    """Run `train` under the library, with the library's options from `argv` (default: sys.argv) and the
    team's own after `--`; exits the process with the run's status (as `python -m trainer` does).

    Meant for `if __name__ == "__main__": api.main(train)` at the end of a team's script, started by
    torchrun or ft_launcher. The chart runs the same function as `python -m trainer --entrypoint=...`.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    options = args[: args.index("--")] if "--" in args else args
    if not any(a == "--entrypoint" or a.startswith("--entrypoint=") for a in options):
        args.insert(0, f"--entrypoint={train.__module__}:{train.__name__}")
    # The api's one reach into the runtime: starting it is what `main` is for. Imported here, at the
    # call, so that nothing else of the api depends on the runtime (which imports the api).
    from trainer.runtime.entry import run

    sys.exit(run(args, train))
