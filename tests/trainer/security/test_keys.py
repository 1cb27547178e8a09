"""trainer/security/keys.py: a key file that is not a key stops the run in one line naming its env var."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainer.security import keys


@pytest.mark.parametrize("content", [b"", b"short", b"\n" * 40])
def test_key_files_that_are_not_keys_stop_in_one_line(tmp_path: Path, content: bytes, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from trainer.config.errors import UnrecoverableError

    path = tmp_path / "key"
    path.write_bytes(content)
    monkeypatch.setenv(keys.CKPT_KEY_ENV, str(path))
    with pytest.raises(UnrecoverableError, match=rf"^{keys.CKPT_KEY_ENV}: key file .* holds \d+ bytes"):
        keys.checkpoint_key(tmp_path / "ckpt")
    import os

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    monkeypatch.setenv(keys.CKPT_KEY_ENV, str(fifo))
    with pytest.raises(UnrecoverableError, match="not a regular file"):
        keys.checkpoint_key(tmp_path / "ckpt")
