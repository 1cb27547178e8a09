"""The process's entry: `module:function` resolved to the team's training function, the library's options
parsed and checked, the preflight, then the run (`run`, called by `python -m trainer` and `api.main`).
"""

from __future__ import annotations

import importlib
import inspect
import logging
import os
import sys
from collections.abc import Sequence

from trainer.api.check import entry_check
from trainer.api.job import TrainFn
from trainer.config.components import check_entrypoint
from trainer.config.errors import EXIT_CONFIG, EXIT_NO_RESTART, UnrecoverableError, error_line, printable
from trainer.config.settings import ConfigError
from trainer.config.train_config import split_entry_args
from trainer.runtime.failures import one_line


def resolve(entrypoint: str) -> TrainFn:
    """The function `entrypoint` names (`module:function`; a bare module means `module:train`), checked to
    take one argument (the Job). Raises ConfigError("entrypoint", ...): no restart can fix any of this."""
    check_entrypoint(entrypoint)
    module_name, _, attr = entrypoint.partition(":")
    attr = attr or "train"
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise ConfigError(
                "entrypoint",
                f"no module {module_name} in this image ({exc.name} not found): install the team's code into "
                "the image (docs/bring-your-own.md)",
            ) from None
        raise ConfigError("entrypoint", f"importing {module_name} failed: {one_line(exc)}") from None
    except Exception as exc:  # a team module that raises at import: the same error at every restart
        raise ConfigError("entrypoint", f"importing {module_name} failed: {one_line(exc)}") from None
    fn = getattr(module, attr, None)
    if fn is None:
        raise ConfigError("entrypoint", f"{module_name} has no {attr}")
    if not callable(fn):
        raise ConfigError("entrypoint", f"{module_name}:{attr} is a {type(fn).__name__}, not a function")
    try:
        inspect.signature(fn).bind(object())
    except TypeError:
        raise ConfigError(
            "entrypoint", f"{module_name}:{attr}{inspect.signature(fn)} must take one argument, the Job"
        ) from None
    except ValueError:  # no signature to inspect (a builtin): let the call tell
        pass
    return fn


def run(argv: Sequence[str], train: TrainFn | None = None, *, recorded_checked: bool = False) -> int:
    """Parse and check everything, then train; returns the exit status.

    `train`: the function to run (`api.main`'s); None resolves `--entrypoint`. A configuration or input
    error prints one `config error: <field>: why` line and exits 2 in `--check-config` or without a
    launcher, 93 (ft_launcher's no-restart code) under one. `recorded_checked`: the caller already
    looked for an unrecoverable error an earlier start of this run recorded (`python -m trainer` does,
    before torch is imported).
    """
    argv = list(argv)
    check_only = "--check-config" in split_entry_args(argv)[0]
    final = EXIT_NO_RESTART if "TORCHELASTIC_RUN_ID" in os.environ and not check_only else EXIT_CONFIG
    from trainer.resilience.verdict import recorded_line

    line = None if check_only or recorded_checked else recorded_line(argv, os.environ)
    if line is not None:  # an earlier start of this run met an error no restart can fix
        print(line, file=sys.stderr)
        return EXIT_NO_RESTART
    from trainer.config.train_config import config_from_args

    try:
        from trainer.config.inputs import check_env

        check_env(os.environ)  # before the config: its timeouts read two of these settings
        cfg = config_from_args(argv)
        fn = train if train is not None else resolve(cfg.run.entrypoint)
        from trainer.runtime.preflight import preflight

        world = preflight(cfg, os.environ, check_config=check_only, entry_check=entry_check(fn))
    except UnrecoverableError as exc:
        print(error_line(exc), file=sys.stderr)
        if final == EXIT_NO_RESTART:  # a 0.4.1 ft_launcher relaunches anyway: the record ends those at once
            from trainer.resilience.verdict import record_unrecoverable

            record_unrecoverable(argv, exc, int(os.environ.get("RANK", "0") or 0), os.environ)
        return final
    if check_only:
        ranks = f"{world.world_size} ranks" if world.world_size else "world size not known here"
        print(printable(f"config ok: entry point {cfg.run.entrypoint}, {cfg.run.steps} steps, {ranks}"))
        return 0
    logging.basicConfig(
        level=os.environ.get("TRAINER_LOG_LEVEL", "WARNING"),
        format=f"%(asctime)s rank{os.environ.get('RANK', '0')} %(name)s %(levelname)s %(message)s",
    )
    from trainer.runtime.train import main as train_main  # torch.distributed imports only after validation

    try:
        return train_main(cfg, fn)
    except UnrecoverableError as exc:  # raised before the loop (e.g. the metrics port taken meanwhile)
        print(error_line(exc), file=sys.stderr)
        from trainer.resilience.verdict import record_unrecoverable

        record_unrecoverable(argv, exc, int(os.environ.get("RANK", "0") or 0), os.environ)
        return EXIT_NO_RESTART
