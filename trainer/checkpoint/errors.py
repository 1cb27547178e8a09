"""What can go wrong with checkpoints, as the training loop needs to tell it apart.

- CheckpointWriteError: one save failed (a full disk, a storage hiccup, a writer that died or timed
  out). Nothing was committed; training goes on and the next interval saves again (see loop.py).
- CheckpointFailuresExceeded: saves failed `failure_limit` times in a row; the run stops.
- NoLoadableCheckpoint: committed checkpoints exist and none of them loads; the run stops before
  training unless the user allows a fresh start. No restart can fix it (the same files fail the same way).
"""

from __future__ import annotations

from collections.abc import Sequence

from trainer.config.errors import UnrecoverableError


class CheckpointWriteError(RuntimeError):
    """A checkpoint could not be written; `step` is the failed save's step (-1 when not known)."""

    def __init__(self, message: str, step: int = -1) -> None:
        super().__init__(message)
        self.step = step


class CheckpointFailuresExceeded(UnrecoverableError):
    """`failure_limit` consecutive saves failed (the last reason in the message)."""

    def __init__(self, failures: int, last_reason: str) -> None:
        super().__init__(
            "ckpt_dir",
            f"{failures} checkpoint saves in a row failed (--ckpt-failure-limit); last: {last_reason}",
        )
        self.failures = failures


class NoLoadableCheckpoint(UnrecoverableError):
    """Committed checkpoints exist, none loads, and a fresh start was not allowed.

    `lines` holds one `<path>: <reason>` line per checkpoint passed over; str() is the whole message.
    """

    def __init__(self, directory: str, skipped: Sequence[tuple[str, str]]) -> None:
        self.lines = [f"skipped checkpoint {path}: {reason}" for path, reason in skipped]
        super().__init__(
            "ckpt_dir",
            f"{directory} holds committed checkpoints but none of them loads; fix or move them, or pass "
            "--allow-fresh-start to train from scratch (retention never deletes checkpoints it cannot "
            "prove are this model's)",
        )

    def __str__(self) -> str:
        return "\n".join([super().__str__(), *self.lines])
