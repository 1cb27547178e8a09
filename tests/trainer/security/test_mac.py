"""trainer/security/mac.py: a signature verifies only the same content, under the same key and purpose,
however the document was formatted; file digests are those of the file's bytes across read chunks."""

from __future__ import annotations

import hashlib
import json
import zlib
from pathlib import Path

import pytest

from trainer.security import mac

KEY = b"k" * 32
DOC = {"step": 7, "files": {"a": {"size": 3}}, "run": "r1"}


def test_a_signed_document_verifies_after_a_json_round_trip_in_another_key_order() -> None:
    signed = mac.sign(DOC, KEY, "checkpoint manifest v1")
    reordered = json.loads(json.dumps(dict(reversed(list(signed.items()))), indent=2))
    assert mac.check(reordered, KEY, "checkpoint manifest v1") is None


@pytest.mark.parametrize(
    ("change", "why"),
    [
        (lambda d: {**d, "step": 8}, "does not verify"),
        (lambda d: {**d, "files": {"a": {"size": 4}}}, "does not verify"),
        (lambda d: {k: v for k, v in d.items() if k != mac.MAC_FIELD}, "not signed"),
        (lambda d: {**d, mac.MAC_FIELD: 1}, "not signed"),
    ],
)
def test_an_altered_or_unsigned_document_is_refused(change, why) -> None:  # type: ignore[no-untyped-def]
    signed = mac.sign(DOC, KEY, "checkpoint manifest v1")
    assert why in (mac.check(change(signed), KEY, "checkpoint manifest v1") or "")


def test_another_key_or_purpose_does_not_verify() -> None:
    signed = mac.sign(DOC, KEY, "checkpoint manifest v1")
    assert mac.check(signed, b"x" * 32, "checkpoint manifest v1") is not None
    assert mac.check(signed, KEY, "nvme seal v1") is not None


def test_file_digests_are_the_bytes_digests_across_chunks(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    data = bytes(range(256)) * 5 + b"tail"
    path = tmp_path / "f"
    path.write_bytes(data)
    monkeypatch.setattr(mac, "_CHUNK", 7)  # many reads, the last one short
    assert mac.file_digests(path) == (f"{zlib.crc32(data):08x}", hashlib.sha256(data).hexdigest())
