"""The reference model: the project's own Llama-style training function, one user of the public API
(trainer/api) like any team's, and `python -m trainer`'s default entry point (`trainer.reference:train`).

- config.py:     its own settings (preset, token file, sequence length, micro-batch, learning rate),
                 declared like the library's and parsed from the entry point's arguments (after `--`);
- entry.py:      `train(job)`, the training function, checked by `check_reference` in the preflight;
- model.py:      the Llama-style decoder with FSDP2 sharding and its size presets;
- data.py:       memory-mapped token files, a resumable batch cursor, `python -m trainer.reference.data`
                 (the chart's synthetic-data init container);
- data_check.py: does a token file fit the run, checked before any process group in bounded time.

`train` is imported on first use, not here: the harnesses import config.py (stdlib only) for the chart
table, and the entry point imports torch and the api.
"""

from __future__ import annotations

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "train":
        from trainer.reference.entry import train

        return train
    raise AttributeError(f"module 'trainer.reference' has no attribute {name!r}")
