"""Configuration, CLI, timeouts and fault specs: everything that must fail before a process group starts."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT, free_port
from trainer.config.train_config import ConfigError, config_from_args
from trainer.resilience.timeouts import TimeoutNestingError, Timeouts, trainer_ports
from trainer.runtime.faults import FaultInjector, FaultSpec, InjectedFault, parse_fault, resolve_ranks


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from trainer.reference.data import write_synthetic_tokens

    return write_synthetic_tokens(tmp_path_factory.mktemp("d") / "t.npy", 10_000, 2048, seed=1)


def _args(*extra: str) -> list[str]:
    return ["--out-dir", "/tmp/unused-out", *extra]


def test_defaults_parse_and_nest() -> None:
    cfg = config_from_args(_args(), env={})
    assert cfg.run.inprocess and cfg.ckpt.dir == Path("/tmp/unused-out/ckpt")
    t = cfg.timeouts
    assert (
        t.collective_timeout
        < t.inprocess_soft_timeout
        < t.inprocess_hard_timeout
        < t.inprocess_barrier_timeout
        < t.heartbeat_timeout
    )
    assert cfg.to_dict()["run"]["out_dir"] == "/tmp/unused-out"


def test_the_library_config_holds_no_model_data_or_optimizer() -> None:
    """A team's function needs no reference-model flag: the library neither requires nor knows one."""
    cfg = config_from_args(_args("--entrypoint=team.train"), env={})
    assert set(cfg.to_dict()) == {"run", "ckpt", "timeouts", "snapshot", "metrics", "faults", "guard"}
    assert "lr" not in cfg.to_dict()["run"]
    with pytest.raises(ConfigError, match="config error: arguments: unrecognized arguments: --data-path"):
        config_from_args(_args("--data-path=/tmp/x.npy"), env={})


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        (["--preset", "huge"], "preset"),
        (["--seq-len", "100000"], "seq_len"),
        (["--seq-len", "0"], "seq_len"),
        (["--micro-batch-size", "0"], "micro_batch_size"),
        (["--lr", "-1"], "lr"),
        (["--lr", "nan"], "lr"),
        (["--steps", "3"], "arguments"),
    ],
)
def test_bad_reference_values_name_the_flag(data: Path, extra: list[str], field: str) -> None:
    from trainer.reference.config import reference_config

    with pytest.raises(ConfigError) as info:
        reference_config(["--data-path", str(data), *extra])
    assert info.value.field == field
    assert str(info.value).startswith(f"config error: {field}: ")


def test_reference_defaults(data: Path) -> None:
    from trainer.reference.config import reference_config

    ref = reference_config(["--data-path", str(data)])
    # The cluster's model (k8s/values.yaml gets the same defaults, generated).
    assert (ref.model.preset, ref.data.path, ref.data.seq_len, ref.optim.lr) == ("8b", data, 4096, 3e-4)
    assert ref.arch.max_seq_len == 8192


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        (["--steps", "0"], "steps"),
        (["--ckpt-interval", "0"], "ckpt_interval"),
        (["--ckpt-keep", "0"], "ckpt_keep"),
        (["--metrics-port", "70000"], "metrics_port"),
        (["--collective-timeout", "200"], "inprocess_soft_timeout"),
        (["--inprocess-hard-timeout", "50"], "inprocess_hard_timeout"),
        (["--heartbeat-timeout", "100"], "heartbeat_timeout"),
        (["--fault", "meteor:step=3"], "fault"),
        (["--fault", "exception:rank=1"], "fault"),
        (["--fault", "exception:step=5000"], "fault"),
        (["--fault", "ckpt-crash:step=99", "--ckpt-interval", "10", "--steps", "99"], "fault"),
    ],
)
def test_bad_values_name_the_field(extra: list[str], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        config_from_args(_args(*extra), env={})
    assert info.value.field == field
    assert str(info.value).startswith(f"config error: {field}: ")


def test_missing_data_file_is_a_config_error(tmp_path: Path) -> None:
    from trainer.reference.config import reference_config

    with pytest.raises(ConfigError, match=r"config error: data_path: .* does not exist"):
        reference_config(["--data-path", str(tmp_path / "absent.npy")])
    with pytest.raises(ConfigError, match=r"config error: data_path: .* is not a file"):
        reference_config(["--data-path", str(tmp_path)])
    with pytest.raises(ConfigError, match="config error: data_path: the following arguments are required"):
        reference_config([])


def test_faults_come_from_cli_and_env() -> None:
    cfg = config_from_args(
        _args("--fault", "exception:step=3:rank=1"),
        env={"TRAINER_FAULTS": "sigkill:step=5 ; node-loss:step=7:node=1"},
    )
    assert [str(f) for f in cfg.faults.specs] == [
        "exception:step=3:rank=1:node=0",
        "sigkill:step=5:rank=0:node=0",
        "node-loss:step=7:rank=0:node=1",
    ]


def test_cli_help_lists_the_contract_options() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "trainer", "--help"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0
    for option in ("--entrypoint", "--ckpt-mode", "--no-inprocess", "--inprocess-barrier-timeout", "--fault"):
        assert option in out.stdout
    assert "--preset" not in out.stdout and "--data-path" not in out.stdout  # the reference model's


@pytest.mark.parametrize(
    ("reference_args", "line"),
    [
        (
            ["--preset", "tiny", "--seq-len", "4096"],
            "config error: seq_len: must be in [1, 512] for preset tiny",
        ),
        (["--data-path", "/nonexistent/t.npy"], "config error: data_path: /nonexistent/t.npy does not exist"),
    ],
)
def test_bad_config_exits_before_any_process_group(
    data: Path, tmp_path: Path, reference_args: list[str], line: str
) -> None:
    # WORLD_SIZE=2 with no second rank: had the trainer started a process group it would wait for a peer
    # (and write run_start); a config error must end it at once with status 2 and the field named. The
    # reference entry point's own options (after `--`) are checked there too, by its `checked_by` check.
    env = {
        **os.environ,
        "RANK": "0",
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
    }
    out_dir = tmp_path / "out"
    t0 = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "trainer",
            "--out-dir",
            str(out_dir),
            "--",
            # the reference model's data, unless the case gives its own (a flag may be given once)
            *([] if "--data-path" in reference_args else ["--data-path", str(data)]),
            *reference_args,
        ],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert [ln for ln in proc.stderr.splitlines() if ln.strip()] == [proc.stderr.strip()], proc.stderr
    assert proc.stderr.startswith(line), proc.stderr
    assert not list(out_dir.glob("events.rank*.jsonl")), "the trainer got as far as writing events"
    assert time.monotonic() - t0 < 60


def test_timeouts_must_nest() -> None:
    Timeouts(1, 2, 3, 4, 5, None).check()  # None: the liveness timeout follows the hard timeout
    with pytest.raises(TimeoutNestingError) as info:
        Timeouts(1, 2, 3, 4, 5).check()  # the default liveness timeout (10 s) exceeds the hard one
    assert info.value.field == "inprocess_liveness_timeout"
    with pytest.raises(TimeoutNestingError) as info:
        Timeouts(1, 2, 3, 3, 5, None).check()
    assert info.value.field == "inprocess_barrier_timeout"
    with pytest.raises(TimeoutNestingError) as info:
        Timeouts(0, 2, 3, 4, 5, None).check()
    assert info.value.field == "collective_timeout"
    kwargs = Timeouts(1, 2, 3, 4, 5, None).wrapper_kwargs()
    assert kwargs["soft_timeout"] < kwargs["hard_timeout"] < kwargs["barrier_timeout"]
    assert kwargs["heartbeat_timeout"] < kwargs["barrier_timeout"]


def test_trainer_ports_are_distinct_from_the_launchers() -> None:
    ports = trainer_ports({"MASTER_ADDR": "pod-0.svc", "MASTER_PORT": "29500"})
    assert (ports.host, ports.pg_port, ports.inprocess_port) == ("pod-0.svc", 29501, 29502)
    override = trainer_ports(
        {"MASTER_PORT": "29500", "TRAINER_STORE_HOST": "h", "TRAINER_INPROCESS_PORT": "4000"}
    )
    assert (override.host, override.inprocess_port) == ("h", 4000)
    with pytest.raises(ValueError, match="must differ"):
        trainer_ports({"MASTER_PORT": "29500", "TRAINER_PG_PORT": "29500"})


@pytest.mark.parametrize(
    ("text", "spec"),
    [
        ("exception:step=3", FaultSpec("exception", 3, 0, 0)),
        ("sigkill:step=0:rank=2", FaultSpec("sigkill", 0, 2, 0)),
        ("node-loss:step=4:node=1", FaultSpec("node-loss", 4, 0, 1)),
        ("ckpt-corrupt:rank=1:step=9", FaultSpec("ckpt-corrupt", 9, 1, 0)),
    ],
)
def test_parse_fault(text: str, spec: FaultSpec) -> None:
    assert parse_fault(text) == spec


@pytest.mark.parametrize(
    "text",
    ["exception", "exception:step=x", "exception:step=-1", "hang:step=1:rank=1:rank=2", "hang:step=1:when=2"],
)
def test_parse_fault_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_fault(text)


def test_random_rank_is_drawn_from_the_fault_seed() -> None:
    specs = [parse_fault("exception:step=1:rank=random"), parse_fault("sigkill:step=2:rank=random")]
    draws = {tuple(s.rank for s in resolve_ranks(specs, 8, seed)) for seed in range(20)}
    assert resolve_ranks(specs, 8, 5) == resolve_ranks(specs, 8, 5)
    assert len(draws) > 1 and all(0 <= r < 8 for d in draws for r in d)
    with pytest.raises(ValueError, match="does not exist"):
        resolve_ranks([parse_fault("exception:step=1:rank=4")], 2, 0)


def test_a_fault_fires_once_per_run_even_across_restarts(tmp_path: Path) -> None:
    emitted: list[tuple[str, int]] = []

    def injector(rank: int) -> FaultInjector:
        specs = [parse_fault("exception:step=2:rank=1")]
        return FaultInjector(
            specs, rank=rank, node=0, marker_dir=tmp_path, emit=lambda k, s: emitted.append((k, s))
        )

    injector(0).at_step(2)  # not this rank
    first = injector(1)
    first.at_step(1)
    with pytest.raises(InjectedFault):
        first.at_step(2)
    injector(1).at_step(2)  # a "restarted process": the marker file says it already fired
    first.at_step(2)
    assert emitted == [("exception", 2)]


def test_a_node_loss_fires_once_per_run_whichever_rank_of_the_node_claims_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Node 1's loss fires on the ranks of the round that claimed it, and never again on the ranks that
    take node 1's place in a later round (a spare's), even when a rank of the node never got to write
    anything before the pod died (else the fault fires twice)."""
    import trainer.runtime.faults as faults

    fired: list[tuple[int, str]] = []
    rank_now = {"rank": -1}
    monkeypatch.setattr(
        faults,
        "_lose_node",
        lambda: fired.append((rank_now["rank"], os.environ["TORCHELASTIC_RESTART_COUNT"])),
    )

    def reach_step_3(rank: int, round_id: int, markers: Path) -> None:
        monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", str(round_id))
        rank_now["rank"] = rank
        specs = [parse_fault("node-loss:step=3:node=1")]
        FaultInjector(specs, rank=rank, node=1, marker_dir=markers, emit=lambda k, s: None).at_step(3)

    # Rank 3 gets there first and kills the pod before rank 2 reaches the step; in the next round the
    # spare's ranks 2 and 3 reach it and must not fire it again.
    reach_step_3(3, 0, tmp_path / "a")
    reach_step_3(2, 1, tmp_path / "a")
    reach_step_3(3, 1, tmp_path / "a")
    assert fired == [(3, "0")]
    assert [p.name for p in (tmp_path / "a").iterdir()] == ["node-loss-step3-rank0-node1"]
    # Both ranks of the node reach it in the same round: both go down with their pod.
    fired.clear()
    reach_step_3(2, 0, tmp_path / "b")
    reach_step_3(3, 0, tmp_path / "b")
    assert fired == [(2, "0"), (3, "0")]


def test_node_loss_never_fires_again_in_a_later_launchers_round_0(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A launcher started anew (the rendezvous service was replaced, or the launcher was killed) counts
    its rounds from 0 again: the ranks of the pod that took node 1's place must not take that round 0
    for the one the marker was written in (seen: a node loss fired twice after the service's loss)."""
    import trainer.runtime.faults as faults
    from trainer.launcher.supervise import LAUNCHER_ID_ENV

    fired: list[str] = []
    monkeypatch.setattr(faults, "_lose_node", lambda: fired.append(os.environ[LAUNCHER_ID_ENV]))
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    for launcher in ("first-launcher", "first-launcher", "second-launcher"):
        monkeypatch.setenv(LAUNCHER_ID_ENV, launcher)
        specs = [parse_fault("node-loss:step=3:node=1")]
        FaultInjector(specs, rank=2, node=1, marker_dir=tmp_path, emit=lambda k, s: None).at_step(3)
    # The first launcher's round 0 fires (on each of its ranks that gets there); the second's never.
    assert fired == ["first-launcher", "first-launcher"]
