"""What the entry point does with an exception that left a training attempt: release the process group
its traceback holds, describe it in one line, and find a refused resume behind it."""

from __future__ import annotations

import traceback
from collections.abc import Iterator


def drop_frames(exc: BaseException) -> None:
    """Detach the tracebacks of `exc` and of the exceptions chained to it, keeping them as text (a note).

    `frame.clear()` (traceback.clear_frames) drops a frame's locals but not the function it runs, and
    `Module._call_impl`'s `inner` is a closure over the module: a collective that failed inside a forward
    hook leaves a traceback that holds the whole FSDP model, so its process group. NVRx keeps the
    exception (`state.fn_exception`) until after its iteration barrier; a peer blocked in a collective
    with this rank (one not connected to the faulting rank) would then wait for the collective timeout.
    """
    for e in _chain(exc):
        tb = e.__traceback__
        if tb is not None:
            e.add_note(
                "Traceback (frames dropped to release the process group):\n"
                + "".join(traceback.format_tb(tb))
            )
            traceback.clear_frames(tb)
            e.__traceback__ = None


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """`exc` and every exception chained to it (causes and contexts), each once, cycles included."""
    seen: set[int] = set()
    pending: list[BaseException | None] = [exc]
    while pending:
        e = pending.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        pending += [e.__cause__, e.__context__]


def one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300] if text else ''}"


def refused_resume(exc: BaseException) -> BaseException | None:
    """The NoLoadableCheckpoint behind `exc` (the in-process Wrapper may wrap it), if any."""
    from trainer.checkpoint.errors import NoLoadableCheckpoint

    return next((e for e in _chain(exc) if isinstance(e, NoLoadableCheckpoint)), None)
