"""The snapshot payload's checksum: XXH3-128 (xxHash), as 32 hex digits in the slot's header.

Every restore verifies the bytes it loads, so the checksum's speed is a floor of the restore from memory
and a share of each snapshot's background commit. zlib's CRC32 is several times slower than a memcpy of
the same bytes, so verification alone would cost more than the copy; XXH3-128 hashes faster than memcpy
copies (docs/history.md has the figures) and, like zlib, releases the GIL while it hashes (from xxhash 4
on), so the background commit overlaps the next step.
It is an integrity check (torn or scribbled bytes), not an authenticator: a replica that crosses the
network is also authenticated by its channel (trainer/snapshot/replica_net.py).
"""

from __future__ import annotations

from typing import Any

import xxhash

NAME = "xxh3_128"
"""Recorded in the header beside the digest, so a slot names how it was checked."""


def payload_checksum(buf: Any) -> str:
    """The checksum of a bytes-like object (a memoryview of a slot's payload, never copied)."""
    return xxhash.xxh3_128_hexdigest(buf)
