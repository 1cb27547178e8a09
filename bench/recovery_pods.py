"""Recovery across pods: a lost node with and without a hot spare, and compound faults (a second fault
while the first is being recovered).

Each scenario runs the chart's pod command (Contract 2) as several local pods under tools/localjob.py (the
Job controller: a dead pod is replaced after ``replace_delay_s``, the time a cluster takes to schedule a
new node), injects faults with the trainer's ``--fault`` option and, for a compound fault, a second one
from outside at the moment it must hit:

==============================  ================================================================
scenario                        faults
==============================  ================================================================
node-loss/spare                 node 1 lost (every process of its pod killed); a hot spare waits
node-loss/no-spare              the same, no spare: the round waits for the replacement pod
node-loss/peer                  node-loss/spare with snapshots every step, replicated to the other
                                node (the chart's defaults): the spare restores the lost node's
                                ranks from the survivor's replica (`peer`), the survivor from its
                                own /dev/shm (bench.snapshot records it for the planner)
compound/rank-during-restart    a rank SIGKILLed, then another one; while ft_launcher restarts the
                                worker group, one of the new workers is SIGKILLed as it starts
compound/spare-during-join      node 1 lost (the spare takes over, the lost pod's replacement
                                becomes the new spare); node 1 lost again and the new spare is
                                lost too, right after the round admitted it
compound/spare-during-join/2-spares
                                the same with two hot spares: the survivors see the lost spare's
                                launcher stop beating (trainer/resilience/liveness.py), and the
                                second spare takes over without waiting for a replacement pod
compound/monitors-then-rank     ft_launcher's rank monitors killed, then a rank SIGKILLed
straggler/evict                 node 1 three times slower from step 3 (`slow` fault); a hot spare
                                waits: the straggler watch evicts node 1, the spare takes its place
kills/each-process              a rank SIGKILLed (the single fault whose MTTR sets the bound), then
                                one of each of a pod's processes SIGKILLed from outside, a few steps
                                apart (tools/podkill.py): the zygote, the metrics exporter, a worker,
                                ft_launcher, the rendezvous service, the pod's main process
==============================  ================================================================

Per run: the MTTR of every fault (trainer.events.metrics.summarize: fault -> first step after it), for a
compound scenario the single fault's MTTR measured in the same run (its first fault) and the compound one's
(its last), worker-group restarts, pod attempts per index (a whole-job restart shows as a replaced pod that
nobody killed), ``linger_s`` (first pod that finished -> last pod gone), the hot spare that took over and
where the last recovery's time went (tools/recovery_phases.py).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench import podrun
from bench.stats import spread
from tools import podkill
from tools.localjob import JobResult, LocalJob, PodSpec
from tools.pod_roles import role_changes, takeover_after
from tools.recovery_phases import launcher_events, phases
from trainer.launcher.standby import is_standby
from trainer.launcher.supervise import EVICTED_EXIT
from trainer.runtime.ports import free_port

REPO = Path(__file__).resolve().parent.parent
FAIL_JOB_EXIT_CODES = (2, 93)  # the chart's failJobExitCodes


@dataclass(frozen=True)
class PodsScenario:
    name: str
    nodes: int
    spares: int
    nproc: int
    faults: tuple[str, ...]
    """The trainer's --fault specs."""
    action: str = ""
    """What the driver does from outside: "" (nothing), "kill-restarting-worker" (after the last fault,
    SIGKILL the first new worker process), "kill-joining-spare" (after the last fault, lose the spare's
    pod as soon as the round admitted it), "kill-monitors" (at step 3, SIGKILL the rank monitors)."""
    inprocess: bool = True
    snapshots: bool = False
    """Snapshots every step, replicated to the next node (the chart's defaults); else none."""
    steps: int = 0
    """Steps of the run; 0: PodsConfig.steps."""
    replace_delay_s: float | None = None
    """Seconds before a dead pod's replacement starts; None: PodsConfig.replace_delay_s."""
    kills: tuple[str, ...] = ()
    """Processes SIGKILLed from outside at a step (tools/podkill.py specs); with an `exporter` kill every
    pod serves metrics, each on a port of its own."""


SCENARIOS: dict[str, PodsScenario] = {
    s.name: s
    for s in (
        PodsScenario("node-loss/spare", 2, 1, 1, ("node-loss:step=6:node=1",)),
        PodsScenario("node-loss/no-spare", 2, 0, 1, ("node-loss:step=6:node=1",)),
        PodsScenario("node-loss/peer", 2, 1, 1, ("node-loss:step=6:node=1",), snapshots=True),
        # Node 0 (pod 0 at the start: GROUP_RANK is the pod index) was the rendezvous host before the
        # rendezvous service; now it is a node like any other (docs/failure-domains.md).
        PodsScenario("host-loss/peer", 2, 1, 1, ("node-loss:step=6:node=0",), snapshots=True),
        PodsScenario(
            "compound/host-then-rank",
            2,
            1,
            1,
            ("node-loss:step=6:node=0",),
            "kill-restarting-worker-any",
            snapshots=True,
        ),
        # The host lost, then the rendezvous service itself: each costs one restart round, no pod.
        PodsScenario(
            "compound/host-then-rendezvous",
            2,
            1,
            1,
            ("node-loss:step=5:node=0",),
            "kill-rendezvous",
            snapshots=True,
            # The service is lost once the replacement waits in the rendezvous: with 14 steps and a 10 s
            # replacement, a quiet faster machine finished the run first (the service was then lost
            # after the last step, and the pending replacement waited for a finished job).
            steps=40,
            replace_delay_s=2.0,
        ),
        # ... and then one pod's ft_launcher process (its workers and rank monitors go with it).
        PodsScenario(
            "compound/host-rendezvous-launcher",
            2,
            1,
            1,
            ("node-loss:step=4:node=0",),
            "kill-rendezvous-then-launcher",
            snapshots=True,
            # The service is lost once node 0's replacement waits in the rendezvous (the driver waits
            # for that), and a launcher 3 steps after: a quick replacement, and steps enough for a cold
            # one. With 20, a replacement whose zygote took 51 s under make test's load joined after the
            # last step; the service was lost then, the launcher never (make test, a slower machine).
            steps=40,
            replace_delay_s=2.0,
        ),
        PodsScenario(
            "compound/rank-during-restart",
            1,
            0,
            2,
            ("sigkill:step=4:rank=1", "sigkill:step=9:rank=1"),
            "kill-restarting-worker",
            inprocess=False,
        ),
        PodsScenario(
            "compound/spare-during-join",
            2,
            1,
            1,
            # The second loss must come after the first one's replacement stands by as the new spare
            # (its launcher takes up to ~10 s to start on 2 loaded cores): with warm worker starts steps
            # 4 -> 10 took 19 s and 4 -> 16 22 s, and the replacement joined the round as an active node.
            # A 2 s replacement: with 10 s, a quiet faster machine ran steps 4 -> 24 before the new spare
            # stood by, and no spare was there to lose while it joined.
            ("node-loss:step=4:node=1", "node-loss:step=24:node=1"),
            "kill-joining-spare",
            steps=28,
            replace_delay_s=2.0,
        ),
        PodsScenario(
            "compound/spare-during-join/2-spares",
            2,
            2,
            1,
            ("node-loss:step=4:node=1", "node-loss:step=24:node=1"),
            "kill-joining-spare",
            steps=28,
            replace_delay_s=2.0,
        ),
        PodsScenario(
            "compound/monitors-then-rank",
            1,
            0,
            2,
            ("sigkill:step=8:rank=1",),
            "kill-monitors",
            inprocess=False,
        ),
        # Found after FAST_STEPS slow steps (3x is past the fast rule's 2x: trainer/resilience/straggler.py),
        # evicted with the spare standing by; the rest of the run at full speed.
        PodsScenario("straggler/evict", 2, 1, 1, ("slow:step=3:node=1:factor=3",), snapshots=True, steps=40),
        PodsScenario(
            "kills/each-process",
            2,
            1,
            1,
            ("sigkill:step=4:rank=1",),
            snapshots=True,
            # The values of compound/host-rendezvous-launcher (a fault-free run of them serves both).
            # Five steps between kills: each one's recovery is over before the next (the window of
            # tools/podkill.extra_wall_s); the pod's main process last, as its pod is then lost.
            steps=40,
            replace_delay_s=2.0,
            kills=tuple(
                f"{p}:step={s}"
                for p, s in (
                    ("zygote", 9),
                    ("exporter", 14),
                    ("worker", 19),
                    ("launcher", 24),
                    ("rendezvous", 29),
                    ("main", 34),
                )
            ),
        ),
    )
}

QUICK = ("node-loss/spare", "node-loss/no-spare")


@dataclass(frozen=True)
class PodsConfig:
    steps: int = 14
    ckpt_interval: int = 3
    tokens: int = 200_000
    replace_delay_s: float = 10.0
    """Seconds before the Job controller's replacement pod starts (a new node takes minutes on EKS)."""
    last_call_s: int = 0
    """rdzvLastCallTimeout (the demo's: see tools/demo-values.yaml)."""
    liveness_s: float = 3.0
    run_timeout_s: float = 300.0


def pod_values(sc: PodsScenario, cfg: PodsConfig) -> dict[str, Any]:
    """The chart values of a scenario: the demo's timeouts, a small sync-checkpointed CPU run."""
    from trainer.reference.config import chart_values

    trainer = chart_values(
        {
            "model.preset": "tiny",
            "data.seq_len": 32,
            "data.micro_batch_size": 2,
            "run.steps": sc.steps or cfg.steps,
            "run.seed": 0,
            "run.inprocess": sc.inprocess,
            "ckpt.interval_steps": cfg.ckpt_interval,
            "ckpt.keep_latest": 3,
            "ckpt.mode": "nvrx",  # the chart's mode: what a cluster runs
            # Without snapshots recovery is from the checkpoint; with them (and replication, which needs
            # the 2 nodes) the lost node's state comes back from its peer's replica.
            "snapshot.interval_steps": 1 if sc.snapshots else 0,
            "snapshot.replication": sc.snapshots,
            "timeouts.collective_timeout": 10,
            "timeouts.inprocess_soft_timeout": 15,
            "timeouts.inprocess_hard_timeout": 20,
            "timeouts.inprocess_barrier_timeout": 25,
            "timeouts.heartbeat_timeout": 30,
            "timeouts.inprocess_liveness_timeout": cfg.liveness_s,
            "faults.specs": {f"f{i}": spec for i, spec in enumerate(sc.faults)},
        }
    )
    return {
        **trainer,
        "nodes": sc.nodes,
        "spareNodes": sc.spares,
        "gpusPerNode": sc.nproc,
        "ftInitialRankHeartbeatTimeout": 60,
        "ftWorkloadCheckInterval": 1,
        "monitorInterval": 0.1,  # the demo's (tools/demo-values.yaml)
        "maxRestarts": 6,
        "workersStopTimeout": 5,
        "terminationGracePeriodSeconds": 15,
        "rdzvJoinTimeout": 120,
        "rdzvLastCallTimeout": cfg.last_call_s,
    }


def make_data(path: Path, cfg: PodsConfig) -> Path:
    if not path.exists():
        from trainer.reference.data import write_synthetic_tokens
        from trainer.reference.model import PRESETS

        path.parent.mkdir(parents=True, exist_ok=True)
        write_synthetic_tokens(path, cfg.tokens, PRESETS["tiny"].vocab_size, seed=3)
    return path


def pod_specs(
    sc: PodsScenario,
    cfg: PodsConfig,
    run_dir: Path,
    data: Path,
    port: int,
    *,
    extra_values: dict[str, Any] | None = None,
    tree: Path = REPO,
    metrics_ports: Sequence[int] = (),
) -> list[PodSpec]:
    """One PodSpec per Job index (nodes + spares), each with its own node-local directories (NVMe tier,
    /dev/shm), empty in a replacement pod (tools/localpods.py node_places). `extra_values` go over the
    scenario's chart values; `tree`: the checkout whose trainer the pods import; `metrics_ports`: one
    metricsPort per index (the local pods share one host), else none serves metrics."""
    from tools.localpods import node_places, node_pod_spec
    from tools.podcommand import LocalPlaces, pod_argv

    env = podrun.pod_env(tree)
    specs = []
    for index in range(sc.nodes + sc.spares):
        places = node_places(LocalPlaces(port, data, run_dir / "out", run_dir / "ckpt"), index)
        pod_env = {**env, "GROUP_RANK": str(index), "JOB_COMPLETION_INDEX": str(index)}
        metrics = {"metricsPort": metrics_ports[index]} if metrics_ports else {}
        argv = pod_argv({**pod_values(sc, cfg), **(extra_values or {}), **metrics}, places)
        log = run_dir / "logs" / f"pod-{index}.log"
        specs.append(node_pod_spec(f"pod-{index}", argv, pod_env, log, places))
    return specs


def _read_events(out: Path) -> list[dict[str, Any]]:
    from trainer.events.metrics import read_events

    return read_events(out)[0] if out.is_dir() else []


def _ppid(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return -1


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _is_worker(cmdline: str) -> bool:
    """`python -u -m trainer ...` (a cold worker or a forked one's stand-in), not a launcher process, whose
    command line also holds `-m trainer ...` after ft_launcher's own options, nor a rank monitor."""
    return (
        " -m trainer " in f"{cmdline} " and "ft_launcher" not in cmdline and "trainer.launcher" not in cmdline
    )


def _launchers(main_pid: int, procs: set[int]) -> set[int]:
    """The pod's launcher processes: its main process and, under the supervisor
    (trainer/launcher/supervise.py), ft_launcher's process, its child (not the warm standby beside it)."""
    children = {p for p in procs if _ppid(p) == main_pid and not is_standby(p)}
    return {main_pid} | {p for p in children if "trainer.launcher.ft" in _cmdline(p)}


class Driver:
    """The scenario's outside action, called every poll with the events so far; records what it did."""

    def __init__(self, sc: PodsScenario, job: LocalJob, log_dir: Path) -> None:
        self.sc, self.job, self.log_dir = sc, job, log_dir
        self.done: dict[str, Any] | None = None
        pods = sc.nodes + sc.spares
        self.kills = podkill.Schedule(podkill.parse_all(sc.kills, pods), job, pods)
        self._old_workers: set[int] = set()
        self._did: dict[str, Any] = {}
        self._log_marks: dict[int, int] = {}

    def workers(self, indexes: Sequence[int] = (0,)) -> set[int]:
        """The worker processes (`python -u -m trainer`, children of the pod's launcher: the
        ft_launcher process, the supervisor's child) of the pods of `indexes`."""
        found: set[int] = set()
        for index in indexes:
            pod = self.job.pod(index)
            procs = pod.processes()
            launchers = _launchers(pod.pid, procs)
            # not the prefork zygote (`-m trainer.launcher.prefork.server`), also the launcher's child
            found |= {p for p in procs - launchers if _ppid(p) in launchers and _is_worker(_cmdline(p))}
        return found

    def _a_training_launcher(self) -> tuple[int, int] | None:
        """(pod index, pid) of the ft_launcher process of a pod that has workers now."""
        for index in self._pod_indexes():
            if not self.workers((index,)):
                continue
            pod = self.job.pod(index)
            procs = pod.processes()
            for pid in _launchers(pod.pid, procs) - {pod.pid}:
                return index, pid
        return None

    def _pod_indexes(self) -> range:
        return range(self.sc.nodes + self.sc.spares)

    def _replacements_wait(self) -> bool:
        """Some pod was replaced, and every replacement's launcher has asked to join a round since the
        fault (its log past where it stood when the driver first saw the fault)."""
        replaced = [i for i in self._pod_indexes() if self.job.attempt(i) >= 1]
        for index in replaced:
            with self.job.log_path(index).open("rb") as fh:
                fh.seek(self._log_marks[index])
                if b"attempts to join the next round" not in fh.read():
                    return False
        return bool(replaced)

    def _any_succeeded(self) -> bool:
        """A pod completed: the run is over, and a loss now is not the scenario's (docs/failure-domains.md:
        the service lost while a replacement is still to start leaves that pod waiting)."""
        return any(e.reason == "succeeded" for e in self.job.exits)

    def __call__(self, events: list[dict[str, Any]]) -> None:
        self.kills(events)
        if self.done is not None or not self.sc.action:
            return
        injected = [e for e in events if e["ev"] == "fault_injected"]
        last_fault_fired = len({(e["fault"], e["step"]) for e in injected}) == len(self.sc.faults)
        if self.sc.action == "kill-monitors":
            if any(e["ev"] == "step" and int(e["step"]) >= 3 for e in events):
                procs = self.job.pod(0).processes()
                main = self.job.pod(0).pid
                # The rank monitors are ft_launcher's children that carry its command line. Under the
                # supervisor ft_launcher is itself a child of the pod's main process with "ft_launcher" in
                # its command line: counting the main process as their parent killed ft_launcher instead.
                ft = _launchers(main, procs) - {main} or {main}
                monitors = [p for p in procs if _ppid(p) in ft and "ft_launcher" in _cmdline(p)]
                for pid in monitors:
                    os.kill(pid, signal.SIGKILL)
                self.done = {"action": self.sc.action, "t": time.time(), "pids": sorted(monitors)}
        elif self.sc.action in ("kill-restarting-worker", "kill-restarting-worker-any"):
            pods = self._pod_indexes() if self.sc.action.endswith("-any") else (0,)
            if not last_fault_fired:
                self._old_workers |= self.workers(pods)
                return
            new = self.workers(pods) - self._old_workers
            if new:
                pid = min(new)
                os.kill(pid, signal.SIGKILL)
                self.done = {"action": self.sc.action, "t": time.time(), "pids": [pid]}
        elif self.sc.action.startswith("kill-rendezvous") and last_fault_fired and not self._any_succeeded():
            fault_step = max(int(e["step"]) for e in injected)
            last_step = max((int(e["step"]) for e in events if e["ev"] == "step"), default=-1)
            # The worst moment for the service's loss: the lost pod's replacement (an empty /dev/shm,
            # the lowest infrastructure rank) already waits in the rendezvous, so a new service that
            # ranked pods afresh would make it active (seen once under load: the job started over).
            if not self._log_marks:  # where each pod's log stood when the fault was first seen
                self._log_marks = {i: self.job.log_path(i).stat().st_size for i in self._pod_indexes()}
            if "rendezvous" not in self._did and last_step >= fault_step + 3 and self._replacements_wait():
                pids = sorted(self.job.kill_rendezvous())
                self._did["rendezvous"] = {"t": time.time(), "step": last_step, "pids": pids}
            if self.sc.action == "kill-rendezvous" and "rendezvous" in self._did:
                self.done = {"action": self.sc.action, **self._did["rendezvous"]}
            elif "rendezvous" in self._did and last_step >= self._did["rendezvous"]["step"] + 3:
                launcher = self._a_training_launcher()
                if launcher is not None:
                    index, pid = launcher
                    os.kill(pid, signal.SIGKILL)
                    self._did["launcher"] = {"t": time.time(), "pod": index, "pids": [pid]}
                    self.done = {"action": self.sc.action, **self._did}
        elif self.sc.action == "kill-joining-spare" and last_fault_fired:
            t_fault = max(float(e["t"]) for e in injected)
            took = takeover_after(role_changes(self.log_dir), t_fault)
            if took is not None:
                index = int(took.spare.rsplit("-", 1)[1])
                pids = self.job.kill_pod(index)
                self.done = {
                    "action": self.sc.action,
                    "t": time.time(),
                    "pod": took.spare,
                    "pids": sorted(pids),
                }


def run_once(sc: PodsScenario, cfg: PodsConfig, run_dir: Path, data: Path) -> dict[str, Any]:
    """Run one scenario once; its figures (see the module docstring)."""
    podrun.fresh(run_dir)
    port = free_port()
    pods = sc.nodes + sc.spares
    exporter = any(podkill.parse(k).process == "exporter" for k in sc.kills)
    metrics_ports = [free_port() for _ in range(pods)] if exporter else []
    specs = pod_specs(sc, cfg, run_dir, data, port, metrics_ports=metrics_ports)
    (run_dir / "command.json").write_text(json.dumps(list(specs[0].argv), indent=1))
    drivers: list[Driver] = []

    def watch(job: LocalJob) -> Callable[[], None]:
        drivers.append(Driver(sc, job, run_dir / "logs"))
        return lambda: drivers[0](_read_events(run_dir / "out"))

    run = podrun.run_job(
        specs,
        host_port=port,
        timeout_s=cfg.run_timeout_s,
        backoff_limit=len(specs) + 2,
        fail_job_exit_codes=FAIL_JOB_EXIT_CODES,
        replace_delay_s=cfg.replace_delay_s if sc.replace_delay_s is None else sc.replace_delay_s,
        watch=watch,
    )
    rec = measure(sc, run_dir, run.result, drivers[0].done, run.elapsed_s, drivers[0].kills.records())
    rec["load_avg_1min"] = run.load_avg_1min
    return rec


def measure(
    sc: PodsScenario,
    run_dir: Path,
    result: JobResult,
    action: dict[str, Any] | None,
    wall_s: float,
    kills: Sequence[dict[str, Any]] = (),
) -> dict[str, Any]:
    from trainer.events.metrics import summarize

    out = run_dir / "out"
    summary = summarize(out) if out.is_dir() else {}
    faults = summary.get("faults") or []
    logs = "\n".join(p.read_text(errors="replace") for p in sorted((run_dir / "logs").glob("pod-*.log")))
    finished = [e.t for e in result.exits if e.reason == "succeeded"]
    nodes_lost = sum(1 for f in faults if f["type"] == "node-loss")
    rec: dict[str, Any] = {
        "scenario": sc.name,
        "succeeded": result.succeeded,
        "reason": result.reason,
        "wall_s": wall_s,
        "status": summary.get("status"),
        "faults": [
            {
                **{k: f.get(k) for k in ("type", "step", "tier", "mttr_s", "steps_recomputed")},
                **{k: f.get(k) for k in ("ranks", "restored_step", "restored_from", "restored_by_source")},
                "lost_restored_from": lost_source(f),
            }
            for f in faults
        ],
        "mttr_s": faults[-1]["mttr_s"] if faults else None,
        "single_mttr_s": faults[0]["mttr_s"] if len(faults) > 1 else None,
        "worker_group_restarts": logs.count("will restart worker group"),
        "pod_attempts": {i: result.attempts(i) for i in sorted({e.index for e in result.exits})},
        "pod_exits": [asdict(e) for e in result.exits],
        "linger_s": (max(e.t for e in result.exits) - min(finished)) if finished else None,
        "action": action,
        "kills": list(kills),
    }
    # Pods that ended before the job did and were not lost on purpose: a whole-job (pod) restart.
    lost_on_purpose = nodes_lost + (1 if sc.action == "kill-joining-spare" else 0)
    lost_on_purpose += sum(1 for k in kills if k["process"] == "main" and k["pids"])
    early = [e for e in result.exits if e.reason != "succeeded"]
    # A straggler's pod that left for the spare (the chart's failure policy ignores its status).
    lost_on_purpose += sum(1 for e in early if e.returncode == EVICTED_EXIT)
    rec["unplanned_pod_restarts"] = max(0, len(early) - lost_on_purpose)
    if rec["single_mttr_s"] and rec["mttr_s"]:
        rec["compound_over_single"] = rec["mttr_s"] / rec["single_mttr_s"]
    if faults and (run_dir / "logs").is_dir():
        t_last = float(faults[-1]["t"])
        rec["phases"] = phases(_read_events(out), launcher_events(run_dir / "logs"), t_last)
        if sc.spares:
            took = takeover_after(role_changes(run_dir / "logs"), float(faults[0]["t"]))
            rec["takeover"] = took.spare if took else None
    rec["ok"] = bool(
        result.succeeded
        and summary.get("status") == "completed"
        and len(faults) == len(sc.faults)
        and all(f.get("recovered") for f in faults)
        and (not sc.action or action is not None)
        and len(kills) == len(sc.kills)
        and all(k["pids"] for k in kills)
        and rec["unplanned_pod_restarts"] == 0
    )
    return rec


def lost_source(fault: dict[str, Any]) -> str | None:
    """Where the ranks a fault hit restored from (a node loss: the lost node's ranks; the survivors'
    source, rank 0's `restored_from`, says nothing about the lost state); None when they disagree."""
    hit = {int(r) for r in fault.get("ranks") or [fault.get("rank")] if r is not None}
    by_source: dict[str, list[int]] = fault.get("restored_by_source") or {}
    sources = {src for src, ranks in by_source.items() if hit & {int(r) for r in ranks}}
    return sources.pop() if len(sources) == 1 else None


def aggregate(records: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Median, min and max per scenario over the successful repetitions."""
    out: dict[str, dict[str, Any]] = {}
    for name in dict.fromkeys(r["scenario"] for r in records):
        runs = [r for r in records if r["scenario"] == name]
        good = [r for r in runs if r.get("ok")]
        entry: dict[str, Any] = {"runs": len(runs), "ok": len(good)}
        keys = ("mttr_s", "single_mttr_s", "compound_over_single", "linger_s", "worker_group_restarts")
        for key in (*keys, "load_avg_1min"):
            entry[key] = spread([r[key] for r in good if r.get(key) is not None])
        entry["takeovers"] = sorted({str(r.get("takeover")) for r in good if "takeover" in r})
        ph = [r["phases"] for r in good if r.get("phases")]
        if ph:
            entry["phases"] = {k: spread([p[k] for p in ph]) for k in ph[0]}
        out[name] = entry
    return out


def run(
    names: Sequence[str], reps: int, work: Path, cfg: PodsConfig, log: Callable[[str], Any] = print
) -> dict[str, Any]:
    """``reps`` repetitions of each scenario, interleaved."""
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown:
        raise ValueError(f"scenarios: unknown {unknown}; choose from {sorted(SCENARIOS)}")
    data = make_data(work / "tokens.npy", cfg)
    records = []
    for rep in range(reps):
        for name in names:
            rec = run_once(SCENARIOS[name], cfg, work / f"{name.replace('/', '-')}-rep{rep}", data)
            rec["rep"] = rep
            records.append(rec)
            log(
                f"recovery_pods {name} rep {rep}: ok={rec['ok']} mttr={rec['mttr_s']} "
                f"single={rec['single_mttr_s']} linger={rec['linger_s']} ({rec['wall_s']:.0f} s)"
            )
    return {
        "config": asdict(cfg),
        "scenarios": {n: asdict(SCENARIOS[n]) for n in names},
        "reps": reps,
        "runs": records,
        "summary": aggregate(records),
    }


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.recovery_pods", description=__doc__.split("\n")[0])
    p.add_argument("--scenario", action="append", choices=sorted(SCENARIOS), help="default: all")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--work", type=Path, default=REPO / "out" / "bench" / "recovery_pods")
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "recovery_pods.json")
    args = p.parse_args(argv)
    result = run(args.scenario or list(SCENARIOS), args.reps, args.work, PodsConfig())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    print(f"wrote {args.out}", file=sys.stderr)
    return 0 if all(v["ok"] == v["runs"] for v in result["summary"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
