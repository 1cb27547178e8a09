"""bench.recovery's event analysis and aggregation, and bench.report's tables and README section."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import recovery, report
from tools.podcommand import launcher_argv


def _ev(ev, t, rank=0, restart=0, iteration=0, **fields):
    return {
        "ev": ev,
        "t": t,
        "rank": rank,
        "pid": 100 + rank + 10 * restart,
        "restart": restart,
        "iteration": iteration,
        **fields,
    }


def _step(step, t_start, t_end, restart=0, iteration=0):
    return _ev(
        "step",
        t_end,
        restart=restart,
        iteration=iteration,
        step=step,
        t_start=t_start,
        t_end=t_end,
        loss=1.0,
        tokens=8,
    )


def _write_events(out: Path, events):
    out.mkdir(parents=True)
    by_rank: dict[int, list] = {}
    for e in events:
        by_rank.setdefault(e["rank"], []).append(e)
    for rank, evs in by_rank.items():
        (out / f"events.rank{rank}.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evs))


def _tier2_run(out: Path):
    """Steps 0-5 of 1 s, save after step 2, fault at step 5 on rank 1, workers restarted by the launcher."""
    ev = [
        _ev("run_start", 0.0, world_size=2, config={}),
        _ev("run_start", 0.0, rank=1, world_size=2, config={}),
    ]
    ev += [_step(s, 1.0 + s, 2.0 + s) for s in range(5)]
    ev += [_ev("ckpt_save", 4.1, step=2, blocked_s=0.1, mode="sync", bytes=10)]
    ev += [_ev("fault_injected", 6.0, rank=1, fault="sigkill", step=5)]
    ev += [_ev("fault_detected", 6.5, tier=2, reason="SIGTERM")]
    ev += [_ev("run_start", 8.0, restart=1, world_size=2, config={})]
    ev += [_ev("restore", 9.0, restart=1, step=2, path="ckpt/step2", load_s=0.5)]
    ev += [_step(s, 10.0 + s - 3, 11.0 + s - 3, restart=1) for s in range(3, 8)]
    ev += [_ev("run_end", 15.0, restart=1, step=7, status="completed")]
    _write_events(out, ev)


def test_measure_reads_detection_resume_mttr_and_phases(tmp_path):
    _tier2_run(tmp_path / "out")
    rec = recovery.measure(
        tmp_path / "out", recovery.SCENARIOS["sigkill/tier2"], 0.0, [{"rc": 0, "t": 15}], 0
    )
    assert rec["ok"] is True
    assert rec["detection_s"] == pytest.approx(0.5)
    assert rec["resume_s"] == pytest.approx(4.0)  # fault at 6, first step after it starts at 10
    assert rec["mttr_s"] == pytest.approx(4.0)  # trainer.events.metrics agrees
    assert rec["regain_s"] == pytest.approx(6.0)  # steps 3 and 4 are recomputed, step 5 starts at 12
    assert rec["steps_recomputed"] == 2
    assert rec["unplanned_restarts"] == 0
    assert rec["phases"] == pytest.approx(
        {"detect": 0.5, "restart": 1.5, "init": 0.5, "load": 0.5, "first_step": 1.0}
    )
    assert (tmp_path / "out" / "summary.json").is_file()


def test_measure_full_restart_detects_at_the_pod_exit_and_flags_failures(tmp_path):
    _tier2_run(tmp_path / "out")
    sc = recovery.SCENARIOS["sigkill/full"]
    exits = [{"attempt": 0, "rc": 1, "t": 7.0}, {"attempt": 1, "rc": 0, "t": 15.0}]
    rec = recovery.measure(tmp_path / "out", sc, 0.0, exits, 0)
    assert rec["detection_s"] == pytest.approx(1.0)
    assert recovery.measure(tmp_path / "out", sc, 0.0, exits, 1)["ok"] is False


def test_aggregate_reports_median_and_spread_of_good_runs_only():
    runs = [
        {"scenario": "a", "ok": True, "resume_s": 1.0, "detection_s": 0.1},
        {"scenario": "a", "ok": True, "resume_s": 3.0, "detection_s": 0.3},
        {"scenario": "a", "ok": True, "resume_s": 2.0, "detection_s": 0.2},
        {"scenario": "a", "ok": False, "resume_s": 99.0},
    ]
    agg = recovery.aggregate(runs)["a"]
    assert agg["runs"] == 4 and agg["ok"] == 3
    assert agg["resume_s"] == {"median": 2.0, "min": 1.0, "max": 3.0, "n": 3}
    assert agg["mttr_s"] is None


def test_config_rejects_a_fault_without_recompute():
    with pytest.raises(ValueError, match="fault_step"):
        recovery.RecoveryConfig(steps=30, fault_step=15, ckpt_interval=5)
    with pytest.raises(ValueError, match="nproc"):
        recovery.RecoveryConfig(nproc=1)


def test_pod_command_follows_contract_2(tmp_path):
    cfg = recovery.RecoveryConfig()
    argv = recovery.pod_command(cfg, recovery.SCENARIOS["exception/full"], tmp_path, tmp_path / "t.npy", 1234)
    assert argv[1:3] == ["-m", "trainer.launcher"]  # the chart's default: warm worker starts
    argv = launcher_argv(argv)
    assert argv[0].endswith("ft_launcher")
    assert "--rdzv-endpoint=127.0.0.1:1234" in argv and "--max-restarts=0" in argv
    assert "--ft-restart-policy=any-failed" in argv
    assert argv[argv.index("-m") + 1] == "trainer"
    assert "--no-inprocess" in argv and f"--fault=exception:step={cfg.fault_step}:rank=1" in argv


def test_readme_section_is_replaced_between_markers_only():
    text = f"# T\nbefore\n{report.START}\nold\n{report.END}\nafter\n"
    out = report.replace_between_markers(text, "new body\n")
    assert out == f"# T\nbefore\n{report.START}\nnew body\n{report.END}\nafter\n"
    assert report.replace_between_markers(out, "new body\n") == out  # idempotent
    with pytest.raises(ValueError, match="markers"):
        report.replace_between_markers("no markers", "x")


def test_report_builds_tables_and_plots_from_results(tmp_path):
    results = tmp_path / "results"
    results.mkdir()
    spread = {"median": 2.0, "min": 1.5, "max": 3.0, "n": 3}
    rec = {
        "config": recovery.RecoveryConfig().__dict__,
        "reps": 3,
        "summary": {
            "exception/tier1": {
                "runs": 3,
                "ok": 3,
                "mttr_s": spread,
                "detection_s": spread,
                "phases": {"detect": 0.1, "restart": 0.2},
            },
            "hang/tier2": {"runs": 3, "ok": 2, "mttr_s": None, "detection_s": spread},
        },
    }
    (results / "recovery.json").write_text(json.dumps(rec))
    stat = {"median": 4.5, "min": 4.0, "max": 5.0, "runs": [4.0, 4.5, 5.0]}
    synth = {
        "teams": 5,
        "repeats": 3,
        "via": "cli",
        "wall_s": stat,
        "tree_peak_rss_mib": stat,
        "max_process_rss_mib": stat,
        "cdk_out_mib": 57.2,
    }
    (results / "synth.json").write_text(json.dumps({"synth": [synth]}))
    stall = {
        "note": "blocked time per save",
        "rows": [{"mode": "sync", "mib_per_rank": 64, "blocked_s": spread, "floor_s": 0.01}],
        "plots": ["bench/results/ckpt_stall.png"],
    }
    (results / "ckpt_stall.json").write_text(json.dumps(stall))
    readme = tmp_path / "README.md"
    readme.write_text(f"x\n{report.START}\n{report.END}\n")
    body = report.write(results, readme)
    assert "| `exception/tier1` | 3/3 | - | - | 2.00 s (1.50-3.00) | 2.00 s (1.50-3.00) | - |" in body
    assert "| `hang/tier2` | 2/3 |" in body
    assert "| 5 | 5 | 4.50 s (4.00-5.00) | - | 4 MiB (4-5) | 4 MiB (4-5) | 57 MiB |" in body
    assert (results / "synth.png").is_file()
    assert "| sync | 64 | 2.000 (1.500-3.000) | 0.01 |" in body
    assert "![checkpoint stall](bench/results/ckpt_stall.png)" in body
    assert (results / "recovery.png").stat().st_size > 5_000
    # The README gets the headline figures only, each pointing at RESULTS.md's full tables.
    text = readme.read_text()
    assert body not in text
    assert "| tier 1: an exception, recovered in-process | 2.00 s (1.50-3.00) | `exception/tier1` |" in text
    assert "[bench/results/RESULTS.md](bench/results/RESULTS.md)" in text
    assert "](recovery.png)" in (results / "RESULTS.md").read_text()


@pytest.mark.parametrize(
    ("detected_by", "label"),
    [
        ("pod exit 1", "job controller (pod exit)"),
        ("ft_launcher: [default] Worker group UNHEALTHY.", "ft_launcher (worker exit)"),
        ("tier 1: InjectedFault: injected exception:step=8", "Wrapper (the exception)"),
        ("tier 1: RuntimeError: ... Timed out waiting 8000ms", "Wrapper (collective timeout)"),
        ("tier 2: LeaveToTier2: ranks [1] terminated", "Wrapper, hands over to tier 2"),
        ("tier 2: signal 15 from the launcher", "SIGTERM from ft_launcher"),
        (None, "-"),
    ],
)
def test_detector_labels(detected_by, label):
    assert report.detector(detected_by) == label
