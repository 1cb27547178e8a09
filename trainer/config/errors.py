"""Errors that no restart can fix, and the exit statuses that tell the launcher and the chart so.

A fault-tolerance layer that retries a deterministic error turns one typo into a restart storm on the
most expensive machines a team has. Anything raised as an `UnrecoverableError` is classified once:
the in-process Wrapper does not start another iteration for it, the worker exits with
`EXIT_NO_RESTART` (NVRx's ft_launcher treats that status as "do not restart") and the chart's pod
failure policy fails the Job at once. `EXIT_CONFIG` is for errors found before any process group
(``--check-config``, the init container), where the status reaches the Job controller directly.
"""

from __future__ import annotations

EXIT_CONFIG = 2
"""Bad configuration or input found before training starts (no process group yet)."""

EXIT_NO_RESTART = 93
"""NVRx ft_launcher's no-restart exit code (`--ft-no-restart-exit-code`, default 93)."""


class UnrecoverableError(RuntimeError):
    """A deterministic error: the same inputs fail the same way after any restart.

    `field` names what the user has to change (a flag, a chart value, a file), so the one line the
    user sees reads ``<field>: <why>``.
    """

    exit_code = EXIT_NO_RESTART

    def __init__(self, field: str, why: str) -> None:
        super().__init__(f"{field}: {why}")
        self.field = field
        self.why = why


def error_line(exc: UnrecoverableError) -> str:
    """The one line the user sees: ``config error: <field>: <why>``.

    Control characters (a newline in a flag value, a path, a file's first bytes) are escaped, so the
    message stays one line whatever the input held.
    """
    return printable(f"config error: {exc.field}: {exc.why}")


def printable(text: str) -> str:
    """`text` with unprintable characters escaped (a path may hold any byte but NUL and '/')."""
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text)
