"""Recovery benchmark: how long each tier takes to get training going again after a fault.

Each scenario runs the pod command (``ft_launcher ... -m trainer ...``, Contract 2) on this machine
as one local pod of ``nproc`` CPU ranks, injects one fault with the trainer's ``--fault`` option, and
reads the run's events (Contract 3) back:

=====================  ===========  ==========================================================
scenario               fault        how it is recovered
=====================  ===========  ==========================================================
exception/tier1        exception    in-process restart (NVRx Wrapper), processes stay up
exception/tier2        exception    in-process off: ft_launcher restarts every worker
exception/full         exception    no restarts at all: the launcher exits, the whole job is
                                    started again (like a Job controller re-creating the pod)
                                    and resumes from the shared checkpoint
sigkill/tier2          sigkill      ft_launcher restarts every worker
sigkill/full           sigkill      full job restart as above
hang/tier1             hang         the Wrapper's soft timeout detects it (detection time)
hang/tier2             hang         in-process off: ft_launcher's heartbeat timeout detects it
=====================  ===========  ==========================================================

Per run it records, from the events: ``detection_s`` (fault -> first ``fault_detected``; for a full
restart, fault -> the launcher's exit), ``mttr_s`` (fault -> start of the first step after it, from
``trainer.events.metrics.summarize``: the recovery proper, what the planner calls MTTR), ``resume_s`` (the
same, computed here from rank 0's events as a cross-check), ``regain_s`` (fault -> start of the
faulted step again: MTTR plus the recompute back to where the fault hit), ``steps_recomputed``,
``load_s`` and a phase breakdown (detect, restart until the process/iteration starts, init until the
restore, load, first step), and ``unplanned_restarts`` (recoveries beyond the injected one: a
collective that timed out on its own, say). Timings on a shared 2-core machine are noisy: every
scenario runs several times and reports median, min and max.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.recovery_measure import aggregate, measure
from trainer.runtime.ports import free_port
from trainer.state.cadence import is_due

REPO = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Scenario:
    """One recovery path: the fault, whether tier 1 is on, and who restarts what."""

    name: str
    fault: str
    inprocess: bool
    launcher_restarts: int
    """ft_launcher --max-restarts (0: the launcher gives up on the first failure)."""
    job_restarts: int = 0
    """How many times the whole pod is started again after the launcher gave up (full restart)."""
    fault_rank: int = 1


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("exception/tier1", "exception", inprocess=True, launcher_restarts=3),
        Scenario("exception/tier2", "exception", inprocess=False, launcher_restarts=3),
        Scenario("exception/full", "exception", inprocess=False, launcher_restarts=0, job_restarts=1),
        Scenario("sigkill/tier2", "sigkill", inprocess=True, launcher_restarts=3),
        Scenario("sigkill/full", "sigkill", inprocess=False, launcher_restarts=0, job_restarts=1),
        Scenario("hang/tier1", "hang", inprocess=True, launcher_restarts=3),
        Scenario("hang/tier2", "hang", inprocess=False, launcher_restarts=3),
    )
}
QUICK = ("exception/tier1", "exception/tier2", "exception/full", "sigkill/tier2", "hang/tier1")


@dataclass(frozen=True)
class RecoveryConfig:
    """The training run every scenario shares (small, so a run takes seconds on CPU)."""

    nproc: int = 2
    preset: str = "tiny"
    seq_len: int = 64
    micro_batch_size: int = 4
    steps: int = 14
    fault_step: int = 8
    ckpt_interval: int = 3
    ckpt_mode: str | None = "torch-async"
    """None: nvrx, the chart's (and the trainer's) default mode."""
    tokens: int = 200_000
    # Short, so a hang costs seconds, yet above the longest wait of a healthy rank for a slow one on a
    # loaded 2-core machine (4 s was seen to time out a checkpoint finalize with no fault at all).
    collective_timeout: float = 8.0
    inprocess_soft_timeout: float = 12.0
    inprocess_hard_timeout: float = 16.0
    inprocess_barrier_timeout: float = 20.0
    heartbeat_timeout: float = 30.0
    initial_heartbeat_timeout: float = 120.0
    workload_check_interval: float = 1.0
    monitor_interval: float = 0.5
    run_timeout_s: float = 180.0
    # 0: the tiers recover from the durable checkpoint, as RESULTS.md's recovery figures were measured;
    # bench.snapshot sets 1 to measure recovery from in-memory snapshots.
    snapshot_interval: int = 0
    extra_trainer_args: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if self.nproc < 2:
            raise ValueError(f"nproc must be >= 2 (the fault hits rank 1), got {self.nproc}")
        if not 0 < self.ckpt_interval < self.fault_step < self.steps:
            raise ValueError(
                "fault_step: need 0 < ckpt_interval < fault_step < steps, got "
                f"{self.ckpt_interval}, {self.fault_step}, {self.steps}"
            )
        if is_due(self.fault_step - 1, self.ckpt_interval):
            raise ValueError("fault_step: must not follow a save at once (no recompute to measure)")


def make_data(path: Path, cfg: RecoveryConfig) -> Path:
    """Write the token file once (``python -m trainer.reference.data``)."""
    if not path.exists():
        with warnings.catch_warnings():  # torch's import warns that pynvml is deprecated; not ours
            warnings.simplefilter("ignore", FutureWarning)
            from trainer.reference.model import PRESETS  # the vocabulary must fit the preset

        path.parent.mkdir(parents=True, exist_ok=True)
        vocab = PRESETS[cfg.preset].vocab_size
        cmd = [
            sys.executable,
            "-m",
            "trainer.reference.data",
            "--out",
            str(path),
            "--tokens",
            str(cfg.tokens),
        ]
        subprocess.run([*cmd, "--vocab", str(vocab), "--seed", "0"], check=True, cwd=REPO)
    return path


def pod_values(cfg: RecoveryConfig, sc: Scenario) -> dict[str, Any]:
    """The chart values of one scenario: one local node, the benchmark's run and timeouts. The launcher's
    stop and term timeouts and the rendezvous join timeout keep ft_launcher's and torch's own defaults
    (30 s, 1800 s, 600 s), which the recovery figures were measured with."""
    from trainer.reference.config import chart_values
    from trainer.resilience.timeouts import DEFAULT_LIVENESS_TIMEOUT

    launcher = {
        "nodes": 1,
        "gpusPerNode": cfg.nproc,
        "maxRestarts": sc.launcher_restarts,
        "monitorInterval": cfg.monitor_interval,
        "ftInitialRankHeartbeatTimeout": cfg.initial_heartbeat_timeout,
        "ftWorkloadCheckInterval": cfg.workload_check_interval,
        "workersStopTimeout": 30,
        "terminationGracePeriodSeconds": 1810,  # the chart passes --term-timeout = this - 10
        "rdzvJoinTimeout": 600,
        "extraTrainerArgs": list(cfg.extra_trainer_args),
    }
    trainer = chart_values(
        {
            "model.preset": cfg.preset,
            "data.seq_len": cfg.seq_len,
            "data.micro_batch_size": cfg.micro_batch_size,
            "run.steps": cfg.steps,
            "run.seed": 0,
            "run.inprocess": sc.inprocess,
            "ckpt.interval_steps": cfg.ckpt_interval,
            "ckpt.keep_latest": 3,
            "ckpt.mode": cfg.ckpt_mode or "nvrx",
            "timeouts.collective_timeout": cfg.collective_timeout,
            "timeouts.inprocess_soft_timeout": cfg.inprocess_soft_timeout,
            "timeouts.inprocess_hard_timeout": cfg.inprocess_hard_timeout,
            "timeouts.inprocess_barrier_timeout": cfg.inprocess_barrier_timeout,
            "timeouts.heartbeat_timeout": cfg.heartbeat_timeout,
            # The trainer's own default, as a value the chart can check against the hard timeout.
            "timeouts.inprocess_liveness_timeout": min(DEFAULT_LIVENESS_TIMEOUT, cfg.inprocess_hard_timeout),
            "snapshot.interval_steps": cfg.snapshot_interval,
            "faults.specs": {"bench": f"{sc.fault}:step={cfg.fault_step}:rank={sc.fault_rank}"},
        }
    )
    return {**launcher, **trainer}


def pod_command(cfg: RecoveryConfig, sc: Scenario, run_dir: Path, data: Path, port: int) -> list[str]:
    """The pod command of Contract 2 as the chart renders it, for one local node."""
    from tools.podcommand import LocalPlaces, pod_argv

    places = LocalPlaces(port, data, run_dir / "out", run_dir / "ckpt", run_dir / "local")
    return pod_argv(pod_values(cfg, sc), places)


def run_once(cfg: RecoveryConfig, sc: Scenario, run_dir: Path, data: Path) -> dict[str, Any]:
    """Run one scenario once and measure its recovery from the events.

    The pod is a one-index Job beside the job's rendezvous service, as the chart deploys it: the Job
    controller (LocalJob) re-creates a failed pod `sc.job_restarts` times (the full restart). Without the
    service the launcher hosted the store and waited NVRx's 3 s store-read grace before it exited, a
    second that no pod of the chart pays, inside every full restart's detection (3.9 s, 2026-12-02)."""
    from bench import podrun
    from tools.localjob import PodSpec  # kills the whole process tree, workers included

    podrun.fresh(run_dir)
    port = free_port()
    env = podrun.pod_env(REPO)
    argv = pod_command(cfg, sc, run_dir, data, port)
    (run_dir / "command.json").write_text(json.dumps(argv, indent=1))
    t_launch = time.time()
    # A re-created pod lands on another node: the node-local checkpoint tier is gone, only the shared
    # one remains (a pod's fresh_dirs are emptied before each of its attempts).
    pod = PodSpec("bench", argv, env, run_dir / "pod0.log", fresh_dirs=(run_dir / "local",))
    run = podrun.run_job([pod], host_port=port, timeout_s=cfg.run_timeout_s, backoff_limit=sc.job_restarts)
    result, started = run.result, run.attempts_of_first
    exits = [{"attempt": e.attempt, "rc": e.returncode, "t": e.t} for e in result.exits]
    # rc: the last pod's exit code; None when it was still running at the timeout (stopped, not exited).
    rc = result.exits[-1].returncode if result.exits and len(result.exits) == started else None
    return measure(run_dir / "out", sc, t_launch, exits, rc)


def run(names: Sequence[str], reps: int, work: Path, cfg: RecoveryConfig, log: Any = print) -> dict[str, Any]:
    """Run ``reps`` repetitions of each scenario (interleaved, so load drifts hit all alike)."""
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        raise ValueError(f"scenarios: unknown {unknown}; choose from {sorted(SCENARIOS)}")
    data = make_data(work / "tokens.npy", cfg)
    records = []
    for rep in range(reps):
        for name in names:
            run_dir = work / f"{name.replace('/', '-')}-rep{rep}"
            t0 = time.monotonic()
            rec = run_once(cfg, SCENARIOS[name], run_dir, data)
            rec["rep"] = rep
            rec["out_dir"] = str(run_dir / "out")
            records.append(rec)
            log(
                f"recovery {name} rep {rep}: ok={rec.get('ok')} detect={_fmt(rec.get('detection_s'))} "
                f"mttr={_fmt(rec.get('mttr_s'))} regain={_fmt(rec.get('regain_s'))} "
                f"({time.monotonic() - t0:.0f} s)"
            )
    return {
        "config": asdict(cfg),
        "scenarios": {n: asdict(SCENARIOS[n]) for n in names},
        "reps": reps,
        "runs": records,
        "summary": aggregate(records),
    }


def _fmt(v: Any) -> str:
    return "-" if v is None else f"{float(v):.2f}s"


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.recovery", description=__doc__.split("\n")[0])
    p.add_argument("--scenario", action="append", choices=sorted(SCENARIOS), help="default: all")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--quick", action="store_true", help="fewer scenarios, one repetition")
    p.add_argument("--work", type=Path, default=REPO / "out" / "bench" / "recovery")
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "recovery.json")
    args = p.parse_args(argv)
    names = args.scenario or (list(QUICK) if args.quick else list(SCENARIOS))
    reps = 1 if args.quick else args.reps
    cfg = RecoveryConfig()
    result = run(names, reps, args.work, cfg)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"wrote {args.out}")
    return 0 if all(v["ok"] == v["runs"] for v in result["summary"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
