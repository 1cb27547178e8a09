"""Bad inputs a real team produces by mistake end in one `config error: <field>: why` line, before any
process group: exit 2 in `--check-config` (the pod's init container), 93 at a worker's start-up under a
launcher (ft_launcher's no-restart code). Table-driven: one input per case, the expected line asserted.

Most cases call the entry point in-process (the same `main` as `python -m trainer`); a few run it as a
real subprocess, as the init container does.
"""

from __future__ import annotations

import os
import pickle
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import REPO_ROOT, free_port
from tools.podcommand import replacing

# The environment a pod or launcher would set; cleared so the developer's shell cannot leak into a case.
LAUNCH_ENV = (
    "WORLD_SIZE",
    "GROUP_WORLD_SIZE",
    "RANK",
    "LOCAL_RANK",
    "NNODES",
    "NPROC_PER_NODE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "RDZV_ENDPOINT",
    "TORCHELASTIC_RUN_ID",
    "TRAINER_FAULTS",
    "TRAINER_PG_PORT",
    "TRAINER_INPROCESS_PORT",
)
VOCAB = 2048  # the tiny preset's
SEQ_LEN = 32


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in LAUNCH_ENV:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.fixture(scope="module")
def good_tokens(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from trainer.reference.data import write_synthetic_tokens

    return write_synthetic_tokens(tmp_path_factory.mktemp("data") / "tokens.npy", 20_000, VOCAB, seed=1)


REFERENCE_FLAGS = ("--preset", "--data-path", "--seq-len", "--micro-batch-size", "--lr")
"""The reference entry point's own options (trainer/reference/config.py): given after `--`."""


def base_args(data: Path, out: Path, *extra: str) -> list[str]:
    """The library's options and `extra`'s, then `--` and the reference model's (`extra`'s last); an
    option of `extra` replaces the base's of the same name (both parsers refuse a flag given twice)."""
    ours = [e for e in extra if e.partition("=")[0] in REFERENCE_FLAGS]
    library = [e for e in extra if e not in ours]
    library_base = [f"--out-dir={out}", "--steps=10", "--device=cpu"]
    reference_base = ["--preset=tiny", f"--data-path={data}", f"--seq-len={SEQ_LEN}", "--micro-batch-size=2"]
    return [*replacing(library_base, library), "--", *replacing(reference_base, ours)]


def run_main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    from trainer.__main__ import main

    status = main(argv)
    return status, capsys.readouterr().err


def assert_one_line(err: str, field_name: str, text: str) -> None:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith(f"config error: {field_name}: "), err
    assert text in lines[0], err
    assert "Traceback" not in err


# ---- token files ---------------------------------------------------------------------------------------


def _synthetic(vocab: int, tokens: int = 20_000) -> Callable[[Path], Path]:
    def make(path: Path) -> Path:
        from trainer.reference.data import write_synthetic_tokens

        return write_synthetic_tokens(path, tokens, vocab, seed=2)

    return make


def _no_sidecar(make: Callable[[Path], Path]) -> Callable[[Path], Path]:
    def wrapped(path: Path) -> Path:
        out = make(path)
        out.with_name(out.name + ".meta.json").unlink()
        return out

    return wrapped


def _npy(array: np.ndarray) -> Callable[[Path], Path]:
    def make(path: Path) -> Path:
        np.save(path, array, allow_pickle=True)
        return path

    return make


def _raw(data: bytes) -> Callable[[Path], Path]:
    def make(path: Path) -> Path:
        path.write_bytes(data)
        return path

    return make


def _truncated(path: Path) -> Path:
    np.save(path, np.arange(10_000, dtype=np.uint16) % VOCAB)
    path.write_bytes(path.read_bytes()[:4_000])
    return path


def _npz(path: Path) -> Path:
    np.savez(path.with_suffix(".npz"), tokens=np.zeros(1000, np.uint16))
    path.with_suffix(".npz").rename(path)
    return path


@dataclass(frozen=True)
class DataCase:
    name: str
    make: Callable[[Path], Path]
    text: str
    env: dict[str, str] = field(default_factory=dict)


DATA_CASES = [
    DataCase(
        "ids beyond the vocabulary, recorded maximum", _synthetic(4096), "holds token id 4095 (recorded in"
    ),
    DataCase(
        "ids beyond the vocabulary, found by the sample", _no_sidecar(_synthetic(4096)), "at token index"
    ),
    DataCase(
        "a pickle named .npy",
        _raw(pickle.dumps(list(range(100)))),
        "is not a .npy array: it is a Python pickle",
    ),
    DataCase(
        "a text file named .npy",
        _raw(b"the quick brown fox\n"),
        "it looks like text (starts with 'the quic')",
    ),
    DataCase("an .npz named .npy", _npz, "it is a zip archive"),
    DataCase("an empty file", _raw(b""), "it is empty"),
    DataCase(
        "pickled objects in an .npy",
        _npy(np.array([{"a": 1}, None], dtype=object)),
        "holds pickled Python objects",
    ),
    DataCase("floats", _npy(np.zeros(10_000, np.float32)), "holds a float32 array of shape (10000,)"),
    DataCase("signed ints", _npy(np.zeros(10_000, np.int64)), "holds a int64 array"),
    DataCase("a 2-D array", _npy(np.zeros((100, 100), np.uint16)), "shape (100, 100)"),
    DataCase("a truncated file", _truncated, "is truncated: its header promises 10000 tokens"),
    DataCase(
        "shorter than one sequence",
        _npy(np.zeros(20, np.uint16)),
        "has 20 tokens; seq_len 32 on 1 rank(s) needs at least 33",
    ),
    DataCase(
        "shorter than one sequence per rank",
        _npy(np.zeros(100, np.uint16)),
        "has 100 tokens; seq_len 32 on 8 rank(s) needs at least 257",
        {"NNODES": "2", "NPROC_PER_NODE": "4"},
    ),
    DataCase("a directory", lambda p: (p.mkdir(), p)[1], "is not a file"),
]


@pytest.mark.parametrize("case", DATA_CASES, ids=lambda c: c.name)
def test_bad_token_file_fails_check_config_in_one_line(
    case: DataCase, tmp_path: Path, clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for name, value in case.env.items():
        clean_env.setenv(name, value)
    data = case.make(tmp_path / "tokens.npy")
    status, err = run_main(base_args(data, tmp_path / "out", "--check-config"), capsys)
    assert status == 2
    assert_one_line(err, "data_path", case.text)


def test_good_token_file_passes_and_bounds_its_reads(good_tokens: Path) -> None:
    from trainer.reference.data_check import SAMPLE_CHUNK_TOKENS, SAMPLE_CHUNKS, check_token_file

    info = check_token_file(good_tokens, vocab_size=VOCAB, seq_len=SEQ_LEN, world_size=4)
    assert info.num_tokens == 20_000 and info.recorded_max == info.max_seen <= VOCAB - 1
    # Large file: only the sample is read; an id outside it is not seen here (the batch path catches it).
    big = np.zeros(8 * SAMPLE_CHUNKS * SAMPLE_CHUNK_TOKENS, dtype=np.uint32)
    path = good_tokens.with_name("big.npy")
    np.save(path, big)
    outside = SAMPLE_CHUNK_TOKENS + 7  # between the first and second sampled chunk
    mm = np.load(path, mmap_mode="r+")
    mm[outside] = 10 * VOCAB
    mm.flush()
    del mm
    assert check_token_file(path, vocab_size=VOCAB, seq_len=SEQ_LEN).max_seen == 0
    mm = np.load(path, mmap_mode="r+")
    mm[-1] = 10 * VOCAB  # the last chunk is always sampled
    mm.flush()
    del mm
    from trainer.config.train_config import ConfigError

    with pytest.raises(ConfigError, match=r"token id 20480 \(at token index"):
        check_token_file(path, vocab_size=VOCAB, seq_len=SEQ_LEN)


def test_stale_sidecar_is_ignored(tmp_path: Path) -> None:
    """A sidecar that no longer matches the file's length is not trusted (the sample decides)."""
    from trainer.reference.data import write_synthetic_tokens
    from trainer.reference.data_check import check_token_file

    path = write_synthetic_tokens(tmp_path / "t.npy", 5_000, 4096, seed=0)
    np.save(path, np.arange(6_000, dtype=np.uint16) % VOCAB)  # replaced by another tool; sidecar stale
    assert check_token_file(path, vocab_size=VOCAB, seq_len=SEQ_LEN).recorded_max is None


def test_batch_path_rejects_an_out_of_range_id() -> None:
    import torch

    from trainer.config.errors import UnrecoverableError
    from trainer.reference.data_check import check_batch_tokens

    ok = torch.full((2, 4), VOCAB - 1)
    check_batch_tokens(ok, ok, VOCAB, step=3, path=Path("t.npy"))
    bad = ok.clone()
    bad[1, 2] = VOCAB
    with pytest.raises(UnrecoverableError, match="met in the batch of step 3") as info:
        check_batch_tokens(ok, bad, VOCAB, step=3, path=Path("t.npy"))
    assert info.value.field == "data_path"


# ---- everything else --check-config can check ------------------------------------------------------------


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("0.0.0.0", 0))
        sock.listen(1)
        yield int(sock.getsockname()[1])


@dataclass(frozen=True)
class FlagCase:
    name: str
    extra: list[str]
    field: str
    text: str
    env: dict[str, str] = field(default_factory=dict)


def _flag_cases(tmp: Path, busy: int) -> list[FlagCase]:
    a_file = tmp / "a-file"
    a_file.write_text("x")
    return [
        FlagCase(
            "checkpoint dir is a file", [f"--ckpt-dir={a_file}"], "ckpt_dir", "exists and is not a directory"
        ),
        FlagCase("output dir is a file", [f"--out-dir={a_file}"], "out_dir", "exists and is not a directory"),
        FlagCase(
            "output dir below a file",
            [f"--out-dir={a_file}/run"],
            "out_dir",
            f"{a_file} is a file, not a directory",
        ),
        FlagCase(
            "local checkpoint dir below a file",
            [f"--ckpt-local-dir={a_file}/x/y"],
            "ckpt_local_dir",
            "is a file",
        ),
        FlagCase(
            "checkpoint dir not writable",
            ["--ckpt-dir=/proc/trainer-ckpt"],
            "ckpt_dir",
            "/proc is not writable",
        ),
        FlagCase(
            "heartbeat timeout inf",
            ["--heartbeat-timeout=inf"],
            "heartbeat_timeout",
            "must be a finite decimal number, got 'inf'",
        ),
        FlagCase("heartbeat timeout nan", ["--heartbeat-timeout=nan"], "heartbeat_timeout", "got 'nan'"),
        FlagCase(
            "learning rate overflowing to inf",
            ["--lr=1e999"],
            "lr",
            "must be a finite number, got '1e999' (= inf)",
        ),
        FlagCase(
            "collective timeout -inf", ["--collective-timeout=-inf"], "collective_timeout", "got '-inf'"
        ),
        FlagCase(
            "fault rank beyond the world (pod env)",
            ["--fault=exception:step=3:rank=8"],
            "fault",
            "rank 8 does not exist (world size 8, from NNODES x NPROC_PER_NODE)",
            {"NNODES": "2", "NPROC_PER_NODE": "4"},
        ),
        FlagCase(
            "fault rank beyond the world (launcher env)",
            ["--fault=sigkill:step=3:rank=2"],
            "fault",
            "rank 2 does not exist (world size 2, from WORLD_SIZE)",
            {"WORLD_SIZE": "2"},
        ),
        FlagCase(
            "fault rank beyond the world (TRAINER_FAULTS)",
            [],
            "fault",
            "rank 5 does not exist",
            {"WORLD_SIZE": "2", "TRAINER_FAULTS": "hang:step=2:rank=5"},
        ),
        FlagCase(
            "node-loss of a node that does not exist",
            ["--fault=node-loss:step=3:node=2"],
            "fault",
            "node 2 does not exist (2 nodes)",
            {"NNODES": "2", "NPROC_PER_NODE": "1"},
        ),
        FlagCase(
            "metrics port in use",
            [f"--metrics-port={busy}"],
            "metrics_port",
            f"port {busy} is already in use",
        ),
        FlagCase(
            "metrics port = the rendezvous port",
            ["--metrics-port=29400"],
            "metrics_port",
            "29400 is the rendezvous port",
            {"RDZV_ENDPOINT": "job-0.svc:29400"},
        ),
        FlagCase(
            "metrics port = the process group's store",
            ["--metrics-port=29501"],
            "metrics_port",
            "the process group's store port",
            {"MASTER_PORT": "29500"},
        ),
        FlagCase(
            "repeated-fault bound 0", ["--max-repeated-faults=0"], "max_repeated_faults", "must be >= 1"
        ),
    ]


def test_flag_cases_cover_issue_15s_trainer_list(tmp_path: Path) -> None:
    names = " ".join(c.name for c in _flag_cases(tmp_path, 1))
    for needed in (
        "checkpoint dir is a file",
        "output dir is a file",
        "not writable",
        "heartbeat timeout inf",
        "fault rank beyond",
        "metrics port in use",
    ):
        assert needed in names


@pytest.mark.parametrize("index", range(17))
def test_bad_flag_or_place_fails_check_config_in_one_line(
    index: int,
    tmp_path: Path,
    good_tokens: Path,
    busy_port: int,
    clean_env: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    cases = _flag_cases(tmp_path, busy_port)
    assert len(cases) == 17
    case = cases[index]
    for name, value in case.env.items():
        clean_env.setenv(name, value)
    status, err = run_main(base_args(good_tokens, tmp_path / "out", *case.extra, "--check-config"), capsys)
    assert status == 2, case.name
    assert_one_line(err, case.field, case.text)
    assert not (tmp_path / "out").exists(), "--check-config created the output directory"


def test_a_valid_configuration_passes_check_config(
    tmp_path: Path, good_tokens: Path, clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    clean_env.setenv("NNODES", "2")
    clean_env.setenv("NPROC_PER_NODE", "4")
    status = run_main(
        base_args(good_tokens, tmp_path / "out", "--fault=exception:step=3:rank=7", "--check-config"),
        capsys,
    )[0]
    assert status == 0
    assert not list(tmp_path.glob("out*")), "the check left files behind"


def test_at_start_up_under_a_launcher_the_same_line_exits_93(
    tmp_path: Path, good_tokens: Path, clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without --check-config, under a launcher: same line, ft_launcher's no-restart code, no events."""
    clean_env.setenv("TORCHELASTIC_RUN_ID", "job")
    clean_env.setenv("WORLD_SIZE", "2")
    clean_env.setenv("RANK", "1")
    status, err = run_main(
        base_args(good_tokens, tmp_path / "out", "--fault=exception:step=3:rank=2"), capsys
    )
    assert status == 93
    assert_one_line(err, "fault", "rank 2 does not exist (world size 2, from WORLD_SIZE)")
    # No events: nothing started. The record makes a relaunch (ft_launcher 0.4.1) exit 93 at once.
    assert [p.name for p in (tmp_path / "out").iterdir()] == ["unrecoverable.json"]
    from trainer.resilience.verdict import recorded_line

    argv = base_args(good_tokens, tmp_path / "out", "--fault=exception:step=3:rank=2")
    line = recorded_line(argv, os.environ)
    assert line is not None and line.startswith("config error: fault: ") and "found by rank 1" in line
    assert recorded_line(argv, {**os.environ, "TORCHELASTIC_RUN_ID": "another-job"}) is None
    assert (
        recorded_line(
            base_args(good_tokens, tmp_path / "out", "--fault=exception:step=3:rank=2", "--steps=11"),
            os.environ,
        )
        is None
    )  # the user changed something


# ---- as the init container runs it ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "text"),
    [(_synthetic(4096), "holds token id 4095"), (_raw(pickle.dumps([1, 2])), "it is a Python pickle")],
    ids=["vocabulary", "pickle"],
)
def test_check_config_subprocess(make: Callable[[Path], Path], text: str, tmp_path: Path) -> None:
    data = make(tmp_path / "tokens.npy")
    env = {k: v for k, v in os.environ.items() if k not in LAUNCH_ENV}
    env.update(NNODES="1", NPROC_PER_NODE="2", MASTER_PORT=str(free_port()))
    t0 = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "trainer", *base_args(data, tmp_path / "out", "--check-config")],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 2, proc.stderr
    ours = [line for line in proc.stderr.splitlines() if "pynvml" not in line and line.strip()]
    assert ours[-1].startswith("config error: data_path: ") and text in ours[-1], proc.stderr
    assert "Traceback" not in proc.stderr
    assert time.monotonic() - t0 < 200  # seconds on an idle host; generous for a loaded one


def test_at_start_up_an_out_dir_that_is_a_file_still_ends_in_one_line(
    tmp_path: Path, good_tokens: Path, clean_env: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The record cannot be written there either: still one line and 93, no traceback (found by the
    before/after measurement under ft_launcher)."""
    clean_env.setenv("TORCHELASTIC_RUN_ID", "job")
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    status, err = run_main(base_args(good_tokens, a_file), capsys)
    assert status == 93
    assert_one_line(err, "out_dir", "exists and is not a directory")
    assert a_file.read_text() == "x"
