"""Generated bad inputs for the trainer (trainer/config/inputs.py): random members of each class, not only the
hand-written examples. The rule: refused in one `config error: <field>: why` line (exit 2 in
`--check-config`), or accepted and used exactly as written.

Classes: environment settings (each parsed as its flag), seconds past a week, token files and sidecars
that are not regular files, change while checked or hold random bytes, symlink loops as directories.
"""

from __future__ import annotations

import os
import string
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.trainer._reference import with_reference_last
from trainer.config.inputs import ENV_SETTINGS, MAX_SECONDS, check_env, open_regular
from trainer.config.train_config import ConfigError
from trainer.reference.data_check import _check_open_file, check_token_file, meta_path

VOCAB = 2048  # the tiny preset's
SEQ_LEN = 32
FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
MAIN = settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
# Every variable the chart or a launcher may set and the trainer reads: cleared so the shell cannot leak in.
CLEARED = (*ENV_SETTINGS, "NNODES", "TORCHELASTIC_RUN_ID")


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in CLEARED:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.fixture(scope="module")
def tokens(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from trainer.reference.data import write_synthetic_tokens

    return write_synthetic_tokens(tmp_path_factory.mktemp("data") / "tokens.npy", 20_000, VOCAB, seed=1)


def one_line(err: str, field: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith(f"config error: {field}: "), err
    assert "Traceback" not in err
    return lines[0]


def check_config(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    from trainer.__main__ import main

    status = main(["--check-config", *with_reference_last(argv)])
    return status, capsys.readouterr().err


def base_args(data: Path, out: Path) -> list[str]:
    return [
        "--preset=tiny",
        f"--data-path={data}",
        f"--out-dir={out}",
        f"--seq-len={SEQ_LEN}",
        "--micro-batch-size=2",
        "--steps=10",
        "--device=cpu",
        "--snapshot-interval=0",  # a local run: no snapshots in the host's /dev/shm unless a test asks
    ]


# ---- environment settings ------------------------------------------------------------------------------

# Digits that are not ASCII (str.isdigit and int() accept them), signs, spaces, exponents, words.
NOT_ASCII_DIGITS = "٠١٢٣٤٥٦٧٨٩０１２３４５６７８９۱۲"
junk_text = st.text(alphabet=string.printable + NOT_ASCII_DIGITS, min_size=0, max_size=12)


@FAST
@given(name=st.sampled_from(sorted(ENV_SETTINGS)), text=junk_text)
def test_env_setting_is_parsed_or_refused_naming_it(name: str, text: str) -> None:
    try:
        check_env({name: text})
    except ConfigError as exc:
        assert str(exc).startswith(f"config error: {name}: ") and "\n" not in str(exc)
        return
    # Accepted: the value is one the trainer reads as written (ASCII only, no surrounding space; the
    # fault list is `;`-separated specs, each stripped, so only it may carry spaces).
    assert text.isascii()
    assert name == "TRAINER_FAULTS" or text == text.strip()


@FAST
@given(
    name=st.sampled_from(["TRAINER_INPROCESS_MONITOR_INTERVAL", "TRAINER_INPROCESS_LAST_CALL_WAIT"]),
    seconds=st.floats(min_value=MAX_SECONDS * 1.0001, max_value=1e300),
)
def test_env_seconds_past_a_week_refused(name: str, seconds: float) -> None:
    with pytest.raises(ConfigError, match=rf"^config error: {name}: "):
        check_env({name: repr(seconds)})


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("TRAINER_INPROCESS_MONITOR_INTERVAL", "fast"),
        ("TRAINER_INPROCESS_LAST_CALL_WAIT", "1e14"),
        ("TRAINER_LOG_LEVEL", "verbose"),
        ("TRAINER_PG_PORT", "٢٩٥٠١"),
        ("MASTER_PORT", "70000"),
        ("TRAINER_FAULTS", "sigkill:step=x"),
    ],
)
def test_env_setting_fails_check_config_with_exit_2(
    name: str, text: str, tokens: Path, tmp_path: Path, clean_env: pytest.MonkeyPatch, capsys
) -> None:
    clean_env.setenv(name, text)
    status, err = check_config(base_args(tokens, tmp_path / "out"), capsys)
    assert status == 2, err
    one_line(err, name)


# ---- seconds -------------------------------------------------------------------------------------------

SECONDS_FLAGS = {
    "--collective-timeout": "collective_timeout",
    "--inprocess-barrier-timeout": "inprocess_barrier_timeout",
    "--heartbeat-timeout": "heartbeat_timeout",
    "--metrics-linger": "metrics_linger",
    "--ckpt-write-timeout": "ckpt_write_timeout",
}


@MAIN
@given(flag=st.sampled_from(sorted(SECONDS_FLAGS)), seconds=st.floats(MAX_SECONDS * 1.001, 1e200))
def test_seconds_past_a_week_refused_by_check_config(
    flag: str, seconds: float, tokens: Path, tmp_path: Path, clean_env: pytest.MonkeyPatch, capsys
) -> None:
    status, err = check_config([*base_args(tokens, tmp_path / "out"), f"{flag}={seconds!r}"], capsys)
    assert status == 2, err
    line = [x for x in err.splitlines() if x.strip()]
    assert len(line) == 1 and line[0].startswith("config error: "), err
    assert "Traceback" not in err


def test_every_timeout_at_the_limit_is_accepted(
    tokens: Path, tmp_path: Path, clean_env: pytest.MonkeyPatch, capsys
) -> None:
    """A week is allowed (nested as the timeouts require), so the bound is the stated maximum."""
    week = int(MAX_SECONDS)
    argv = [
        *base_args(tokens, tmp_path / "out"),
        f"--heartbeat-timeout={week}",
        f"--metrics-linger={week}",
        f"--ckpt-write-timeout={week}",
    ]
    status, err = check_config(argv, capsys)
    assert status == 0, err


# ---- files ---------------------------------------------------------------------------------------------


def test_fifo_sidecar_refused_without_blocking(tmp_path: Path, alarm: None) -> None:
    from trainer.reference.data import write_synthetic_tokens

    path = write_synthetic_tokens(tmp_path / "t.npy", 5_000, VOCAB, seed=0)
    meta_path(path).unlink()
    os.mkfifo(meta_path(path))
    with pytest.raises(ConfigError, match=r"^config error: data_path: .*FIFO"):
        check_token_file(path, vocab_size=VOCAB, seq_len=SEQ_LEN)


def test_device_sidecar_refused_without_reading_it(tmp_path: Path, alarm: None) -> None:
    from trainer.reference.data import write_synthetic_tokens

    path = write_synthetic_tokens(tmp_path / "t.npy", 5_000, VOCAB, seed=0)
    meta_path(path).unlink()
    meta_path(path).symlink_to("/dev/zero")
    with pytest.raises(ConfigError, match=r"^config error: data_path: .*character device"):
        check_token_file(path, vocab_size=VOCAB, seq_len=SEQ_LEN)


@pytest.mark.parametrize("target", ["fifo", "/dev/zero", "loop"])
def test_token_file_that_is_not_regular_refused(tmp_path: Path, alarm: None, target: str) -> None:
    path = tmp_path / "t.npy"
    if target == "fifo":
        os.mkfifo(path)
    elif target == "loop":
        (tmp_path / "other").symlink_to(path)
        path.symlink_to(tmp_path / "other")
    else:
        path.symlink_to(target)
    with pytest.raises(ConfigError, match=r"^config error: data_path: "):
        check_token_file(path, vocab_size=VOCAB, seq_len=SEQ_LEN)


@FAST
@given(keep=st.integers(min_value=0, max_value=40_127))
def test_token_file_truncated_while_checked_is_one_line(tmp_path_factory, keep: int) -> None:
    """The file is cut after it was opened (as another writer would): a short read, never SIGBUS."""
    path = tmp_path_factory.mktemp("cut") / "t.npy"
    np.save(path, (np.arange(20_000, dtype=np.uint16) * 7) % VOCAB)
    with open_regular(path, "data_path", max_bytes=1 << 30) as f:
        os.truncate(path, keep)
        with pytest.raises(ConfigError, match=r"^config error: data_path: "):
            _check_open_file(f, vocab_size=VOCAB, seq_len=SEQ_LEN, world_size=1)


def test_token_file_replaced_while_checked_reads_the_opened_file(tmp_path: Path) -> None:
    path = tmp_path / "t.npy"
    np.save(path, np.arange(5_000, dtype=np.uint16) % 100)
    with open_regular(path, "data_path", max_bytes=1 << 30) as f:
        np.save(tmp_path / "new.npy", np.full(5_000, 2047, dtype=np.uint16))
        os.replace(tmp_path / "new.npy", path)
        info = _check_open_file(f, vocab_size=VOCAB, seq_len=SEQ_LEN, world_size=1)
    assert info.max_seen == 99  # the opened file's maximum, not the replacement's


@FAST
@given(data=st.binary(max_size=300), magic=st.booleans())
def test_random_bytes_as_token_file_are_refused_or_read(tmp_path_factory, data: bytes, magic: bool) -> None:
    path = tmp_path_factory.mktemp("rand") / "t.npy"
    path.write_bytes((b"\x93NUMPY" if magic else b"") + data)
    try:
        info = check_token_file(path, vocab_size=VOCAB, seq_len=1)
    except ConfigError as exc:
        assert str(exc).startswith("config error: data_path: ") and "\n" not in str(exc)
    else:
        assert np.load(path).shape == (info.num_tokens,)  # numpy agrees it is a token array


@pytest.mark.parametrize("below", ["", "sub"])
@pytest.mark.parametrize("flag", ["--ckpt-dir", "--ckpt-local-dir", "--snapshot-dir", "--out-dir"])
def test_symlink_loop_as_directory_is_one_line(
    flag: str, below: str, tokens: Path, tmp_path: Path, clean_env: pytest.MonkeyPatch, capsys
) -> None:
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    loop = f"{flag}={tmp_path / 'a' / below}".rstrip("/")
    # the parser refuses a flag given twice: the loop replaces base_args' --out-dir
    argv = [*(a for a in base_args(tokens, tmp_path / "out") if not a.startswith(f"{flag}=")), loop]
    if flag == "--snapshot-dir":
        argv = [*(a for a in argv if not a.startswith("--snapshot-interval=")), "--snapshot-interval=1"]
    status, err = check_config(argv, capsys)
    assert status == 2, err
    line = one_line(err, flag.lstrip("-").replace("-", "_"))
    assert "symlink loop" in line
