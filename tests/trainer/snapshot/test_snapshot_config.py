"""Snapshot options: parsed from the command line, checked before any process group."""

from __future__ import annotations

from pathlib import Path

import pytest

from trainer.config.train_config import ConfigError, config_from_args
from trainer.snapshot.config import SnapshotConfig, run_fingerprint


def _args(data: Path, *extra: str) -> list[str]:
    return ["--out-dir", "/tmp/unused-out", *extra]


def test_snapshots_default_to_every_step_and_parse(token_file: Path) -> None:
    cfg = config_from_args(_args(token_file), env={})  # the cluster's default: a fault costs one step
    assert cfg.snapshot.interval_steps == 1 and cfg.snapshot.dir == Path("/dev/shm/trainer-snapshots")
    assert not config_from_args(_args(token_file, "--snapshot-interval=0"), env={}).snapshot.enabled
    cfg = config_from_args(_args(token_file, "--snapshot-interval=2", "--snapshot-dir=/dev/shm/x"), env={})
    assert cfg.snapshot == SnapshotConfig(interval_steps=2, dir=Path("/dev/shm/x"))
    assert [s for s in range(6) if cfg.snapshot.due(s)] == [1, 3, 5]
    assert cfg.to_dict()["snapshot"] == {"interval_steps": 2, "dir": "/dev/shm/x", "replication": True}
    assert not config_from_args(_args(token_file, "--no-snapshot-replication"), env={}).snapshot.replication


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        (["--snapshot-interval=-1"], "snapshot_interval"),
        (["--snapshot-interval=1", "--snapshot-dir=/tmp/unused-out/ckpt"], "snapshot_dir"),
        (["--snapshot-interval=1", "--ckpt-local-dir=/tmp/l", "--snapshot-dir=/tmp/l"], "snapshot_dir"),
    ],
)
def test_bad_snapshot_options_name_the_field(token_file: Path, extra: list[str], field: str) -> None:
    with pytest.raises(ConfigError) as err:
        config_from_args(_args(token_file, *extra), env={})
    assert err.value.field == field


def test_fingerprint_changes_with_what_decides_the_trajectory() -> None:
    base = {"seed": 1, "lr": 0.1, "ckpt_dir": "/fsx/a"}
    assert run_fingerprint(base) == run_fingerprint(dict(reversed(base.items())))
    assert run_fingerprint(base) != run_fingerprint({**base, "seed": 2})
    assert len(run_fingerprint(base)) == 16
