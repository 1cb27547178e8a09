"""The small files a pod keeps across the ft_launcher processes its supervisor starts: the epoch of the
rendezvous service it joined (trainer/launcher/supervise.py) and the group rank it last held (its claim,
trainer/launcher/patches.py `claim_previous_rank`). Each is replaced atomically, so a launcher killed
mid-write leaves the old file or the new one.

A leaf module (stdlib only): the supervisor, which must not import torch, and the launcher's patches,
which run inside ft_launcher, both use it without importing each other."""

from __future__ import annotations

import contextlib
import os


def write_atomically(path: str, text: str) -> None:
    """Replace the file at `path` with `text`: a reader (or a process killed mid-write) sees the old
    file or the new one, never a part."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


def read_claim(path: str | None) -> int:
    """The group rank this pod's launcher last held (its claim file), or -1."""
    if not path:
        return -1
    try:
        with open(path) as fh:
            value = int(fh.read().strip())
    except (OSError, ValueError):
        return -1
    return value if value >= 0 else -1


def write_claim(path: str | None, rank: int) -> None:
    """Remember `rank` as this pod's group rank; a claim is only a hint, so a failed write is ignored."""
    if not path:
        return
    with contextlib.suppress(OSError):
        write_atomically(path, str(int(rank)))
