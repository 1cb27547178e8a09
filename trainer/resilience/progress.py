"""The checkpoint iteration file that ft_launcher's progress tracker reads (NVRx >= 0.7).

ft_launcher `--ft-checkpoint-iteration-file=PATH --ft-max-no-progress-cycles=K` reads PATH (one integer)
before each restart and stops the job with its no-restart exit code (93) after K consecutive worker-group
cycles in which that number did not grow. The trainer writes the step of each committed checkpoint there
(rank 0, right after the commit), so "progress" means "work that a restart would not lose". Written
atomically (temporary file, fsync, rename): the launcher may read it at any moment, and a torn read would
make it skip a cycle's check.
"""

from __future__ import annotations

import os
from pathlib import Path

ITERATION_FILE = "latest_checkpointed_iteration.txt"
"""Its name inside the checkpoint directory; the chart points the launcher flag at the same path."""


def write_iteration_file(ckpt_dir: Path, step: int) -> Path:
    """Record `step` as the newest committed checkpoint's step; returns the file's path."""
    path = Path(ckpt_dir) / ITERATION_FILE
    tmp = path.with_name(f".{ITERATION_FILE}.{os.getpid()}")
    with open(tmp, "w", encoding="ascii") as fh:
        fh.write(f"{int(step)}\n")
        fh.flush()
        os.fsync(fh.fileno())
    tmp.replace(path)
    return path
