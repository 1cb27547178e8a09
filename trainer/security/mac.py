"""HMAC-SHA256 over JSON documents and files.

A document is signed over its canonical JSON (sorted keys, no whitespace, the `mac` field left out), so
the same content signs the same way whoever formatted the file; the signature names its purpose
(`domain`), so a seal can never be presented as a manifest or the other way round.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from pathlib import Path
from typing import Any

MAC_FIELD = "mac"
_CHUNK = 8 << 20


def _canonical(doc: dict[str, Any]) -> bytes:
    body = {k: v for k, v in doc.items() if k != MAC_FIELD}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def sign(doc: dict[str, Any], key: bytes, domain: str) -> dict[str, Any]:
    """`doc` with its `mac` field set."""
    mac = hmac.new(key, domain.encode() + b"\0" + _canonical(doc), hashlib.sha256).hexdigest()
    return {**doc, MAC_FIELD: f"hmac-sha256:{mac}"}


def check(doc: dict[str, Any], key: bytes, domain: str) -> str | None:
    """None if `doc` carries a valid `mac` under `key`, else why not."""
    given = doc.get(MAC_FIELD)
    if not isinstance(given, str):
        return "not signed (no MAC: written without the checkpoint key, or forged)"
    expected = sign(doc, key, domain)[MAC_FIELD]
    if not hmac.compare_digest(given.encode(), expected.encode()):
        return "MAC does not verify (another key, or altered since it was signed)"
    return None


def file_digests(path: Path) -> tuple[str, str]:
    """(CRC32 as 8 hex digits, SHA-256 hex) of a file, in one pass."""
    import zlib

    crc, sha = 0, hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            crc = zlib.crc32(chunk, crc)
            sha.update(chunk)
    return f"{crc:08x}", sha.hexdigest()
