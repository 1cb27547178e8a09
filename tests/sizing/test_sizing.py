"""The storage sizing model: checkpoint bytes of the presets, FSx throughput and capacity, the problems and
warnings it finds (with the numbers and the smallest valid settings), and the team file's reading."""

from __future__ import annotations

import math

import pytest

from sizing import SizingInputs, checkpoint_bytes, size, smallest_valid_capacity_gib
from sizing.fsx import baseline_mbps, burst_mbps
from sizing.models import PRESET_PARAMETERS, bytes_per_parameter
from sizing.teamfile import TeamSizingError, find_team, inputs_for, interval_steps, team_inputs

GIB = 2**30


def test_preset_parameter_counts_match_the_trainer() -> None:
    from trainer.reference.model import PRESETS

    assert {name: cfg.num_params() for name, cfg in PRESETS.items()} == PRESET_PARAMETERS


def test_bytes_per_parameter() -> None:
    assert bytes_per_parameter() == 12  # the trainer: fp32 weights, two fp32 AdamW moments
    assert bytes_per_parameter("bf16", "adamw") == 14  # + an fp32 master copy
    assert bytes_per_parameter("bf16", "none") == 2
    assert checkpoint_bytes(PRESET_PARAMETERS["70b"]) == 70_553_706_496 * 12
    with pytest.raises(ValueError, match="weights_dtype"):
        bytes_per_parameter("fp8")


def test_fsx_throughput_and_capacity_steps() -> None:
    # AWS counts 2400 GiB as 2.4 TiB; the issue's example: 1200 GiB at 125 MB/s/TiB is 150 MB/s.
    assert baseline_mbps(1200, 125) == pytest.approx(150)
    assert baseline_mbps(2400, 250) == pytest.approx(600)
    assert burst_mbps(2400, 250) == pytest.approx(1200)
    assert burst_mbps(2400, 1000) == pytest.approx(2400)
    with pytest.raises(ValueError, match="125, 250, 500, 1000"):
        baseline_mbps(1200, 200)
    assert [smallest_valid_capacity_gib(g) for g in (1, 1200, 1201, 2400, 2401, 9000)] == [
        1200, 1200, 2400, 2400, 4800, 9600,
    ]  # fmt: skip


def _inputs(**over: object) -> SizingInputs:
    base: dict[str, object] = dict(
        checkpoint_bytes=checkpoint_bytes(PRESET_PARAMETERS["8b"]),
        nodes=2,
        gpus_per_node=8,
        fsx_gib=2400,
        throughput_per_tib=250,
        interval_s=1800.0,
        keep=3,
        step_s=2.0,
        node_mbps=2000.0,
        nvme_gib_per_node=8 * 3576.0,
        reload_budget_s=900.0,
    )
    base.update(over)
    return SizingInputs(**base)  # type: ignore[arg-type]


def test_figures_of_the_default_team() -> None:
    r = size(_inputs())
    ckpt = 8_030_261_248 * 12
    assert r.fsx_mbps == pytest.approx(600)
    assert r.write_s == pytest.approx(ckpt / 600e6)  # 160.6 s
    assert r.reload_s == pytest.approx(ckpt / 600e6)
    assert r.burst_write_s == pytest.approx(ckpt / 1200e6)
    assert r.min_interval_s == r.write_s
    assert r.fsx_needed_gib == pytest.approx(4 * ckpt / GIB / 0.8)
    assert r.nvme_needed_gib_per_node == pytest.approx(4 * ckpt / 2 / GIB)
    assert r.shard_bytes_per_rank == math.ceil(ckpt / 16)
    assert r.stall_s == pytest.approx(math.ceil(ckpt / 16) / 25e9)
    assert r.problems == () and r.warnings == ()


def test_the_nodes_clients_cap_the_durable_rate() -> None:
    r = size(_inputs(fsx_gib=24000, throughput_per_tib=1000, node_mbps=500.0))
    assert r.fsx_mbps == pytest.approx(24000) and r.durable_mbps == pytest.approx(1000)
    assert r.write_s == pytest.approx(8_030_261_248 * 12 / 1000e6)
    slow = size(_inputs(fsx_gib=24000, throughput_per_tib=1000, node_mbps=10.0, interval_s=600.0))
    assert len(slow.problems) == 1
    assert "the nodes' clients move only 20 MB/s together (2 x checkpoints.node_mbps 10)" in slow.problems[0]


def test_the_issues_70b_example_fails_with_the_numbers_and_the_smallest_settings() -> None:
    r = size(_inputs(checkpoint_bytes=checkpoint_bytes(PRESET_PARAMETERS["70b"]), fsx_gib=1200,
                     throughput_per_tib=125, interval_s=3600.0))  # fmt: skip
    write, capacity = r.problems
    assert r.write_s == pytest.approx(846.6e9 / 150e6, rel=1e-3)  # 94 minutes
    assert "one checkpoint (846.6 GB) takes 94.1 min to write at 150 MB/s" in write
    assert "fsx.storage_gib 1200 = 1.2 TiB x fsx.throughput_per_tib 125 MB/s/TiB = 150 MB/s" in write
    assert "interval is 60.0 min (needs 235 MB/s)" in write
    assert "checkpoints.interval_minutes >= 94.1 (interval_steps >= 2823 at 2 s/step)" in write
    assert "fsx.throughput_per_tib 250" in write  # 300 MB/s >= 235 MB/s
    assert "fsx.storage_gib 4800" in write  # also holds the 4 checkpoints
    assert "need 3,942 GiB with 20% headroom, but fsx.storage_gib is 1200" in capacity
    assert capacity.endswith("smallest valid: fsx.storage_gib 4800")
    # The smallest settings it names do pass.
    assert size(_inputs(checkpoint_bytes=checkpoint_bytes(PRESET_PARAMETERS["70b"]), fsx_gib=4800,
                        throughput_per_tib=125, interval_s=3600.0)).problems == ()  # fmt: skip
    assert size(_inputs(checkpoint_bytes=checkpoint_bytes(PRESET_PARAMETERS["70b"]), fsx_gib=4800,
                        throughput_per_tib=125, interval_s=94.1 * 60)).problems == ()  # fmt: skip


def test_capacity_offers_a_smaller_keep_when_one_fits() -> None:
    r = size(_inputs(fsx_gib=1200, keep=20, reload_budget_s=None))
    (problem,) = r.problems
    # 1200 GiB x 0.8 holds 10 checkpoints of 96.4 GB: 9 kept + 1 being written.
    assert problem.endswith("smallest valid: fsx.storage_gib 2400 or checkpoints.keep 9")
    assert size(_inputs(fsx_gib=1200, keep=9)).problems == ()


def test_nvme_tier_that_cannot_hold_the_kept_steps() -> None:
    r = size(_inputs(nvme_gib_per_node=100.0, fsx_gib=24000))
    (problem,) = r.problems
    assert "179 GiB per node (2 nodes), above the node's 100 GiB" in problem
    assert problem.endswith("checkpoints.keep 1")


def test_slow_reload_is_a_warning_not_a_problem() -> None:
    r = size(_inputs(reload_budget_s=60.0))
    assert r.problems == ()
    (warning,) = r.warnings
    assert "takes 2.7 min, above checkpoints.reload_budget_minutes 1" in warning
    assert "fsx.throughput_per_tib 1000 would take 40 s" in warning


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [("nodes", 0, "nodes must be an integer >= 1"), ("interval_s", math.inf, "interval_s must be a finite"),
     ("throughput_per_tib", 300, "throughput_per_tib"), ("headroom", 1.0, "headroom")],
)  # fmt: skip
def test_inputs_are_checked(field: str, value: object, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        _inputs(**{field: value})


def test_team_file_defaults_and_errors() -> None:
    team = {"name": "t", "gpu_node_group": {"instance_type": "p4d.24xlarge", "desired_nodes": 4}}
    i = team_inputs(team)
    assert (i.nodes, i.gpus_per_node, i.fsx_gib, i.throughput_per_tib) == (4, 8, 1200, 250)
    assert i.nvme_gib_per_node == 8 * 931
    assert i.interval_s == 30 * 60 and i.keep == 3 and i.step_s == 2.0
    assert interval_steps(30, 7.0) == 257 and interval_steps(0.01, 60) == 1
    own = inputs_for({"parameters": 1000, "interval_steps": 10, "step_seconds": 3}, nodes=1, gpus_per_node=8,
                     fsx_gib=1200, throughput_per_tib=125, nvme_gib_per_node=None)  # fmt: skip
    assert own.checkpoint_bytes == 12000 and own.interval_s == 30
    for bad, match in [
        ({"interval_minutes": 5, "interval_steps": 9}, "checkpoints.interval_steps: give"),
        ({"model": "8b", "parameters": 9}, "checkpoints.parameters: give"),
        ({"model": "405b"}, "checkpoints.model: must be one of tiny, small, 1b, 8b, 70b, got '405b'"),
        ({"colour": 1}, "checkpoints.colour: unknown key"),
        ({"keep": 0}, "checkpoints.keep: must be >= 1, got 0"),
    ]:
        with pytest.raises(TeamSizingError, match=match):
            team_inputs({**team, "checkpoints": bad})
    with pytest.raises(TeamSizingError, match="team=x: no such team"):
        find_team({"teams": [team]}, "x")
    assert find_team({"teams": [team]}, None) is team
