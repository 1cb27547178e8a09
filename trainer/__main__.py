"""`python -m trainer`: parse and validate the configuration, then train (see trainer/train.py)."""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence

# The in-process Wrapper polls its store with short timeouts; torch's C++ layer logs a warning for every
# poll that times out (tens of lines per second). Keep C++ logs to errors unless the user asks for more.
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")

from trainer.config import ConfigError, config_from_args


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit status (2 for a configuration error, before any process group)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        cfg = config_from_args(argv)
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    if "--check-config" in argv:
        print(f"config ok: preset {cfg.preset}, {cfg.steps} steps, data {cfg.data_path}")
        return 0
    logging.basicConfig(
        level=os.environ.get("TRAINER_LOG_LEVEL", "WARNING"),
        format=f"%(asctime)s rank{os.environ.get('RANK', '0')} %(name)s %(levelname)s %(message)s",
    )
    from trainer.train import main as train_main  # torch.distributed imports only after validation

    return train_main(cfg)


if __name__ == "__main__":
    sys.exit(main())
