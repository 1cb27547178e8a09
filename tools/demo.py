"""`make demo`: the blueprint end to end on one CPU machine.

1. synthesize the default team's environment offline (the CDK app, as `cdk synth` runs it);
2. render the trainer chart with the values that environment deploys, plus tools/demo-values.yaml;
3. run the rendered pod commands (init container, then `ft_launcher ... -m trainer ...`) locally as
   2 pods x 2 ranks, with a soft fault (tier 1, in-process restart) and a hard fault (tier 2, a pod
   lost whole and replaced as the Job controller would) injected through the chart's `faults` value;
4. report: steps, each fault with its tier and recovery time, checkpoint stall, training efficiency,
   written to out/demo/report.json and out/demo/timeline.png.

Only cluster places are swapped for local ones (the rendezvous endpoint, the FSx and NVMe paths);
everything else is the rendered manifest's.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from goodput import predict_from_summary
from tools import podkill
from tools.cfn import helm_releases
from tools.localpods import LocalJob, PodSpec
from tools.pod_roles import active_at, role_changes, takeover_after
from tools.podcommand import LOCAL_KEY_FILES
from tools.podspec import Container, PodTemplate, load_manifests, trainer_pod, with_trainer_options
from tools.recovery_phases import describe, launcher_events, phases, warm_starts
from tools.timeline import draw
from trainer.events.metrics import NOT_A_STOP, read_events, write_summary
from trainer.runtime.ports import free_port

REPO = Path(__file__).resolve().parent.parent
VENV_BIN = Path(sys.executable).parent
RELEASE = "trainer"
TIER_NAMES = {1: "tier 1 (in-process restart)", 2: "tier 2 (ft_launcher restart)"}
GUARD_NAME = "numerical guard (rolled back)"
STRAGGLER_NAME = "straggler watch (nothing stopped)"
REPLACE_DELAY_S = 20.0
STAND_IN_NOTE = (
    "this run used the local stand-in (tools/localjob.py plays the Job controller and the rendezvous "
    "Deployment); `make demo-cluster` runs it on a real control plane, and so does `make demo` once "
    "`make controlplane` (or `make test`) has built one"
)


def say(message: str) -> None:
    print(f"[demo] {message}", flush=True)


# -- 1. synthesize -------------------------------------------------------------------------------
def default_team(teams_file: Path) -> dict[str, Any]:
    """The first team of the teams file (the embedded default)."""
    teams = (yaml.safe_load(teams_file.read_text()) or {}).get("teams") or []
    if not teams:
        raise SystemExit(f"demo: {teams_file} has no teams")
    return dict(teams[0])


def synthesize(teams_file: Path, team: dict[str, Any], out: Path) -> dict[str, Any]:
    """Synthesize one team's stack and return the trainer release's values from its template."""
    cdk_out = out / "cdk.out"
    shutil.rmtree(cdk_out, ignore_errors=True)
    started = time.monotonic()
    cmd = [
        str(REPO / "node_modules/.bin/cdk"),
        "synth",
        "--quiet",
        "-c",
        f"teams_file={teams_file}",
        "-c",
        f"team={team['name']}",
        "-o",
        str(cdk_out),
    ]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"demo: cdk synth failed:\n{proc.stderr[-4000:]}")
    templates = sorted(cdk_out.glob("*.template.json"))
    if len(templates) != 1:
        raise SystemExit(f"demo: expected one template for team {team['name']}, found {len(templates)}")
    resources = json.loads(templates[0].read_text())["Resources"]
    say(f"synthesized {templates[0].name}: {len(resources)} resources in {time.monotonic() - started:.1f} s")
    pseudo = {
        "AWS::AccountId": str(team["account"]),
        "AWS::Region": str(team["region"]),
        "AWS::Partition": "aws",
        "AWS::URLSuffix": "amazonaws.com",
    }
    releases = helm_releases(templates[0], pseudo)
    if RELEASE not in releases:
        raise SystemExit(f"demo: no '{RELEASE}' Helm release in {templates[0].name}")
    return releases[RELEASE]


# -- 2. render -----------------------------------------------------------------------------------
def render(
    release: dict[str, Any], overrides: Path | list[Path], out: Path, sets: list[str] | None = None
) -> PodTemplate:
    """`helm template` with the synthesized values, then each values file of `overrides` in order, then
    each `--set` of `sets`."""
    values_path = out / "values-synthesized.json"
    values_path.write_text(json.dumps(release["Values"], indent=2) + "\n")
    cmd = [
        str(REPO / ".tools/bin/helm"),
        "template",
        RELEASE,
        str(REPO / "k8s"),
        "--namespace",
        str(release.get("Namespace", "default")),
        "-f",
        str(values_path),
    ]
    layered = out / "values-overrides.yaml"
    layered.write_text(yaml.safe_dump(layer(overrides if isinstance(overrides, list) else [overrides])))
    cmd += ["-f", str(layered)]
    for item in sets or []:
        cmd += ["--set", item]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"demo: helm template failed: {proc.stderr.strip()}")
    (out / "rendered.yaml").write_text(proc.stdout)
    pod = trainer_pod(load_manifests(proc.stdout))
    env = pod.trainer.env
    say(
        f"rendered Job {pod.job_name}: {env['NNODES']} pods x {env['NPROC_PER_NODE']} ranks, "
        f"image {release['Values']['image']['repository']}:{release['Values']['image']['tag'][:12]}..."
    )
    return pod


def layer(paths: list[Path]) -> dict[str, Any]:
    """The values files merged in order, as helm merges them, except that a null removes a key before
    the chart's schema sees it (`faults: {soft: null}` drops the demo's soft fault)."""

    def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
        merged = dict(base)
        for key, value in over.items():
            if value is None:
                merged.pop(key, None)
            elif isinstance(value, dict) and isinstance(merged.get(key), dict):
                merged[key] = merge(merged[key], value)
            else:
                merged[key] = value
        return merged

    values: dict[str, Any] = {}
    for path in paths:
        values = merge(values, yaml.safe_load(path.read_text()) or {})
    return values


# -- 3. run --------------------------------------------------------------------------------------
def local_env(container: Container, out: Path, index: int, rdzv_port: int) -> dict[str, str]:
    """A container's env with cluster places swapped for local ones (the only changes the demo makes)."""
    fsx = out / "fsx"
    local = {
        "RDZV_ENDPOINT": f"127.0.0.1:{rdzv_port}",
        "DATA_PATH": str(fsx / "data" / Path(container.env.get("DATA_PATH", "tokens.npy")).name),
        "CHECKPOINT_DIR": str(fsx / "checkpoints"),
        "LOCAL_CHECKPOINT_DIR": str(out / f"nvme-node{index}" / "checkpoints"),
        "OUT_DIR": str(fsx / "runs"),
        # The pod's /tmp scratch volume (the root filesystem is read-only): one folder per local pod.
        "HOME": str(out / f"scratch-node{index}"),
        **LOCAL_KEY_FILES,  # no key Secrets here: the trainer's local fallbacks
    }
    env = {**container.env, **{k: v for k, v in local.items() if k in container.env}}
    env["JOB_COMPLETION_INDEX"] = str(index)  # the Job controller sets it in every pod of an Indexed Job
    # NVRx orders the nodes of a round by this infrastructure rank (SLURM_PROCID on Slurm), so pod 0 starts
    # as node 0 when it is among the first to arrive; later rounds keep each survivor's rank (sticky ranks).
    env["GROUP_RANK"] = str(index)
    Path(local["HOME"]).mkdir(parents=True, exist_ok=True)  # as the kubelet creates the emptyDir
    return env


def shm_dir(out: Path, index: int) -> Path:
    """The pod's memory-backed /dev/shm: one per local pod, and empty in a replacement pod (see run_pods).
    On the cluster the trainer's snapshot directory is its default inside the pod's /dev/shm; the pods
    here share one host, so each is given its own."""
    return out / f"shm-pod{index}" / "trainer-snapshots"


def local_argv(container: Container, env: dict[str, str], out: Path, index: int) -> list[str]:
    """The argv the kubelet would exec, with local places and, for the trainer, the pod's own /dev/shm."""
    return with_trainer_options(container.resolved_argv(env), [f"--snapshot-dir={shm_dir(out, index)}"])


def process_env(pod_env: dict[str, str]) -> dict[str, str]:
    # The image's PATH has ft_launcher and python; here they come from the project's virtualenv.
    base = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHELASTIC", "MASTER_", "RANK"))}
    base["PATH"] = f"{VENV_BIN}{os.pathsep}{base.get('PATH', '')}"
    base["PYTHONPATH"] = str(REPO)
    return {**base, **pod_env}


def run_init_containers(pod: PodTemplate, out: Path, rdzv_port: int) -> None:
    """Pod 0's init containers, in order (the other pods' would find the data written and the same
    config checked, so running them once keeps the demo short without skipping a step)."""
    for container in pod.init_containers:
        env = local_env(container, out, 0, rdzv_port)
        started = time.monotonic()
        proc = subprocess.run(
            local_argv(container, env, out, 0),
            env=process_env(env),
            cwd=REPO,
            capture_output=True,
            text=True,
            check=False,
        )
        if proc.returncode != 0:
            raise SystemExit(f"demo: init container {container.name} failed: {proc.stderr.strip()}")
        say(f"init container {container.name}: done in {time.monotonic() - started:.1f} s")


class Progress:
    """Prints what the run's event files say, as it happens."""

    def __init__(self, run_dir: Path, total_steps: int) -> None:
        self.run_dir, self.total_steps = run_dir, total_steps
        self.seen = 0
        self.last_step_printed = -1

    def update(self) -> None:
        events, _ = read_events(self.run_dir)
        for e in events[self.seen :]:
            kind = e["ev"]
            if (
                kind == "step"
                and e["rank"] == 0
                and (e["step"] % 10 == 0 or e["step"] < self.last_step_printed)
            ):
                say(f"step {e['step']:>3}/{self.total_steps}  loss {e['loss']:.3f}")
                self.last_step_printed = e["step"]
            elif kind == "fault_injected":
                say(f"FAULT injected: {e['fault']} on rank {e['rank']} at step {e['step']}")
            elif kind == "fault_detected" and e["rank"] == 0:
                say(f"  detected by tier {e['tier']}: {e.get('reason', '')}")
            elif kind == "restore" and e["rank"] == 0:
                where = f"step {e['step']}" if e["step"] >= 0 else "scratch (no checkpoint yet)"
                source = f" ({e['source']})" if e.get("source") and e["step"] >= 0 else ""
                say(f"  rank 0 resumed from {where}{source} (load {e['load_s']:.2f} s)")
            elif kind == "ckpt_skipped":
                say(f"  checkpoint skipped: {e['path']}: {e['reason']}")
        self.seen = len(events)


def run_pods(pod: PodTemplate, out: Path, timeout_s: float, kills: tuple[podkill.Kill, ...] = ()) -> bool:
    """Run the pods to the end; `kills`: processes SIGKILLed from outside at a step (tools/podkill.py),
    recorded in out/kills.json."""
    rdzv_port = free_port()
    run_init_containers(pod, out, rdzv_port)
    nnodes = int(pod.trainer.env["NNODES"])
    npods = int(pod.trainer.env.get("MAX_NNODES", nnodes))  # training pods + hot spares
    specs = []
    for index in range(npods):
        env = local_env(pod.trainer, out, index, rdzv_port)
        specs.append(
            PodSpec(
                f"{pod.job_name}-{index}",
                local_argv(pod.trainer, env, out, index),
                process_env(env),
                out / "logs" / f"pod-{index}.log",
                # A replacement pod is a new node: its /dev/shm and NVMe hold nothing of the lost one.
                fresh_dirs=(shm_dir(out, index), Path(env["LOCAL_CHECKPOINT_DIR"])),
            )
        )

    def on_event(kind: str, fields: dict[str, Any]) -> None:
        if kind == "pod_exit" and fields.get("reason") != "succeeded":
            say(
                f"  pod {fields.get('index')} exited {fields.get('returncode')} ({fields.get('reason')}); "
                "the Job controller replaces it"
            )
        elif kind == "pod_start" and fields.get("attempt", 0) > 0:
            say(f"  replacement pod {fields.get('index')} started (attempt {fields.get('attempt')})")

    run_dir = Path(specs[0].env["OUT_DIR"])
    progress = Progress(run_dir, int(_flag(pod.trainer.argv, "--steps")))
    spares = f" + {npods - nnodes} hot spare" if npods > nnodes else ""
    say(f"starting {nnodes} local pods{spares} (logs in {out / 'logs'})")
    with LocalJob(
        specs,
        backoff_limit=3,
        fail_job_exit_codes=(2, 93),  # the chart's failJobExitCodes
        # A lost node's replacement takes minutes on a cluster (new instance, image pull); with a spare
        # the run does not wait for it, so the demo gives it a realistic head start of a few seconds.
        replace_delay_s=REPLACE_DELAY_S if npods > nnodes else 1.0,
        host_port=rdzv_port,
        on_event=on_event,
    ) as job:
        job.start()
        schedule = podkill.Schedule(kills, job, npods, log=lambda m: say(f"  {m}"))
        deadline = time.monotonic() + timeout_s
        result = None
        while result is None and time.monotonic() < deadline:
            result = job.poll()
            progress.update()
            if kills:
                schedule(read_events(run_dir)[0])
            time.sleep(0.1 if schedule.pending else 0.5)
        progress.update()
        if kills:
            (out / "kills.json").write_text(json.dumps(schedule.records(), indent=1) + "\n")
        if result is None:
            say(f"timed out after {timeout_s:.0f} s")
            return False
        say(f"job finished: {result.reason}")
        return result.succeeded


def _flag(argv: list[str], name: str) -> str:
    for arg in argv:
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    raise SystemExit(f"demo: the rendered command has no {name}")


# -- 4. report -----------------------------------------------------------------------------------
def report(run_dir: Path, out: Path, job_ok: bool, nproc: int = 1) -> dict[str, Any]:
    """Summarize the run; `nproc`: ranks per pod (to tell which node a lost rank was on)."""
    summary_path = write_summary(run_dir)
    summary = json.loads(summary_path.read_text())
    prediction = predict_from_summary(summary_path)
    stall = summary["ckpt"]["stall_s"]
    result = {
        "job_succeeded": job_ok,
        "steps": summary["steps"],
        "steps_recomputed": summary["steps_recomputed"],
        "wall_s": summary["wall_s"],
        "productive_s": summary["productive_s"],
        "training_efficiency": summary["training_efficiency"],
        "planner_predicted_efficiency": prediction["predicted_efficiency"],
        "planner_lost": prediction["lost"],
        "loss_breakdown_s": loss_terms(summary),
        "slow_steps": summary["slow_steps"],
        "stragglers": summary.get("stragglers", []),
        "evictions": summary.get("evictions", []),
        "guard": summary.get("guard") or {},
        "checkpoint": {
            "saves": summary["ckpt"]["saves"],
            "stall_median_s": stall["median"],
            "stall_max_s": stall["max"],
            "commits": summary["ckpt"]["commits"],
        },
        "faults": [
            {
                "type": f["type"],
                "tier": f["tier"],
                "recovered": f["recovered"],
                "mttr_s": f["mttr_s"],
                "detection_s": f["detection_s"],
                "step": f["step"],
                "ranks": f["ranks"],
                "steps_recomputed": f["steps_recomputed"],
                "restored_from": f.get("restored_from"),
                "restored_by_source": f.get("restored_by_source", {}),
                "restored_step": f.get("restored_step"),
                "found_at_step": f.get("found_at_step"),
            }
            for f in summary["faults"]
        ],
        "summary": str(summary_path),
    }
    events, _ = read_events(run_dir)
    launcher = launcher_events(out / "logs") if (out / "logs").is_dir() else []
    for fault, raw in zip(result["faults"], summary["faults"], strict=True):
        fault["takeover"] = _takeover(out / "logs", raw, nproc)
        fault["phases_s"] = phases(events, launcher, float(raw["t"]))
        if fault["phases_s"] is not None:
            t_fault = float(raw["t"])
            fault["warm_starts"] = warm_starts(events, t_fault, t_fault + sum(fault["phases_s"].values()))
    (out / "report.json").write_text(json.dumps(result, indent=2) + "\n")
    draw(run_dir, summary, out / "timeline.png")
    print_report(result, out)
    return result


def loss_terms(summary: dict[str, Any]) -> dict[str, float]:
    """The summary's loss breakdown (trainer.events.metrics loss_breakdown) flat: one recovery term per
    fault."""
    loss = summary.get("loss_s") or {}
    out: dict[str, float] = {"startup": float(loss.get("startup", 0.0))}
    # loss_s's recovery list holds one mttr_s per fault that has one (a `slow` fault has none), in order
    stopped = [f for f in summary.get("faults") or [] if f.get("mttr_s") is not None]
    for fault, mttr in zip(stopped, loss.get("recovery") or [], strict=False):
        out[f"recovery:{fault['type']}@{fault['step']}"] = float(mttr)
    for name in ("recompute", "ckpt_stall", "snapshot_stall", "tail", "straggler", "eviction", "other"):
        out[name] = float(loss.get(name, 0.0))
    return out


def _takeover(log_dir: Path, fault: dict[str, Any], nproc: int) -> dict[str, Any] | None:
    """For a lost node: the pod lost and the hot spare that took its place ("pod": None when no spare
    did), from the launchers' logs; None for other faults."""
    if fault["type"] != "node-loss" or not log_dir.is_dir():
        return None
    changes = role_changes(log_dir)
    t_fault = float(fault["t"])
    node = min(int(r) for r in fault["ranks"]) // nproc
    took = takeover_after(changes, t_fault)
    lost = active_at(changes, t_fault, node)
    if took is None:
        return {"lost": lost, "node_rank": node, "pod": None, "joined_after_s": None, "new_spares": []}
    return {"lost": lost, "node_rank": took.rank, "pod": took.spare, "joined_after_s": took.joined_after_s,
            "new_spares": list(took.new_spares)}  # fmt: skip


def restored_sources(fault: dict[str, Any]) -> str:
    """`shm` when every rank restored from one source, else `shm (ranks 0,1), peer (ranks 2,3)`."""
    by_source: dict[str, list[int]] = fault.get("restored_by_source") or {}
    if len(by_source) <= 1:
        return str(fault["restored_from"])
    return ", ".join(
        f"{src} (ranks {','.join(str(r) for r in ranks)})" for src, ranks in sorted(by_source.items())
    )


def print_report(r: dict[str, Any], out: Path) -> None:
    def secs(x: float | None) -> str:
        return "n/a" if x is None else f"{x:.2f} s"

    lines = [
        "",
        "=" * 72,
        "Smoke run report",
        "=" * 72,
        f"steps         {r['steps']} kept, {r['steps_recomputed']} recomputed; wall {r['wall_s']:.1f} s",
        "faults",
    ]
    for f in r["faults"]:
        status = "recovered" if f["recovered"] else "NOT RECOVERED"
        ranks = ",".join(str(r) for r in sorted(f["ranks"]))
        lines.append(
            f"  {f['type']:<10} step {f['step']:<3} rank{'s' if len(f['ranks']) > 1 else ''} {ranks:<4} "
            f"{handled_by(f)}: {status}, detected {secs(f['detection_s'])}, "
            f"back to training {secs(f['mttr_s'])}, {f['steps_recomputed']} steps recomputed"
            + (
                f" (restored step {f['restored_step']} from {restored_sources(f)})"
                if f.get("restored_from")
                else ""
            )
        )
        took = f.get("takeover")
        if took and took["pod"]:
            lines.append(
                f"             {took['lost'] or 'the lost pod'} lost; hot spare {took['pod']} took over as "
                f"node {took['node_rank']} ({took['joined_after_s']:.2f} s after the loss); standing by "
                f"now: {', '.join(took['new_spares']) or 'none'}"
            )
        elif took:
            lines.append(
                f"             {took['lost'] or 'the lost pod'} lost; NO hot spare took over (the job "
                "waited for the lost pod's replacement)"
            )
        if f.get("phases_s"):
            lines.append(f"             where the time went: {describe(f['phases_s'])}")
            if f.get("warm_starts"):
                forked, started = f["warm_starts"]
                lines.append(
                    f"             {forked} of {started} new worker processes forked from their pod's zygote"
                )
    ck = r["checkpoint"]
    lines += [
        f"checkpoints   {ck['saves']} saves, {ck['commits']} committed; training blocked "
        f"{secs(ck['stall_median_s'])} median, {secs(ck['stall_max_s'])} max per save",
        f"efficiency    {r['training_efficiency']:.1%} productive time / wall time "
        f"(goodput planner predicts {r['planner_predicted_efficiency']:.1%} from the measured "
        "MTTR and stall)",
        "lost          " + describe_loss(r["loss_breakdown_s"], r["wall_s"]),
        *describe_slow_steps(r["slow_steps"]),
        *describe_stragglers(r.get("stragglers", []), r.get("evictions", []), r["loss_breakdown_s"]),
        *describe_guard(r.get("guard") or {}),
        f"written       {out / 'report.json'}, {out / 'timeline.png'}",
        "=" * 72,
    ]
    print("\n".join(lines), flush=True)


def describe_slow_steps(slow: dict[str, Any]) -> list[str]:
    """The slow steps (trainer.events.metrics slow_steps): counted as productive above, named here."""
    if not slow["steps"]:
        return []
    return [
        f"slow steps    {len(slow['steps'])} steps ({step_ranges(slow['steps'])}) ran "
        f"{slow['over_median_s']:.1f} s beyond the median step ({slow['median_s']:.2f} s), inside the "
        "productive time (what else ran on the same cores: new processes' helpers starting, background "
        "checkpoint writes)"
    ]


def describe_stragglers(
    found: list[dict[str, Any]],
    evicted: list[dict[str, Any]] | None = None,
    loss: dict[str, float] | None = None,
) -> list[str]:
    """One line per straggler finding (trainer/resilience/straggler.py): the node, how much slower than its
    peers, and what the policy did; then what the stragglers cost (the `straggler` and `eviction` loss
    terms), when they cost anything."""
    done = {"evict": "evicted into the hot spare", "report": "reported"}
    lines = [
        f"straggler     node {f['node']} at step {f['step']}: {f['score']:.2f}x its peers' step time "
        f"({f['history']:.2f}x its own first window); {done.get(f['action'], f['action'])} ({f['reason']})"
        for f in found
    ]
    for e in evicted or []:
        if e.get("down_s") is not None:
            lines.append(
                f"              eviction at step {e['step']}: training stopped {e['down_s']:.2f} s, resumed "
                f"from step {e['restored_step']}, {e['steps_recomputed']} step(s) recomputed"
            )
    waited = (loss or {}).get("straggler", 0.0)
    if waited > 0:
        lines.append(
            f"              the steps waited {waited:.2f} s for a straggling node in all (the `straggler` "
            "loss term: lost, not productive)"
        )
    return lines


def handled_by(fault: dict[str, Any]) -> str:
    """Which tier recovered a fault; a nan or spike the numerical guard rolled back has none."""
    if fault["tier"] is None and fault["type"] in ("nan", "spike"):
        return GUARD_NAME
    if fault["type"] in NOT_A_STOP:
        return STRAGGLER_NAME
    return TIER_NAMES.get(fault["tier"], "tier ?")


def describe_guard(guard: dict[str, Any]) -> list[str]:
    """The numerical guard's rollbacks and suspect nodes (summary.json `guard`), when it acted."""
    if not guard.get("rollbacks") and not guard.get("suspect_nodes"):
        return []
    rollback = guard.get("rollback_s") or {}
    suspects = ", ".join(str(n) for n in guard.get("suspect_nodes") or []) or "none"
    median = rollback.get("median")
    return [
        f"guard         {guard['rollbacks']} step(s) rolled back, the batch of step(s) "
        f"{step_ranges(guard.get('skipped_steps') or [])} skipped"
        + (f", {median:.2f} s median per rollback" if median is not None else "")
        + f"; suspect nodes: {suspects}"
    ]


def step_ranges(steps: list[int]) -> str:
    """`0-4, 16, 36-38` for [0, 1, 2, 3, 4, 16, 36, 37, 38]."""
    runs: list[list[int]] = []
    for step in sorted(steps):
        if runs and step == runs[-1][-1] + 1:
            runs[-1].append(step)
        else:
            runs.append([step])
    return ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs)


def describe_loss(terms: dict[str, float], wall_s: float) -> str:
    """`startup 0.9 s (1.8 %), recovery:exception@17 0.7 s (1.3 %), ...`: the gap to 100 %, term by term."""
    if wall_s <= 0:
        return "n/a"
    return ", ".join(f"{name} {sec:.2f} s ({100 * sec / wall_s:.1f} %)" for name, sec in terms.items())


def injects_faults(pod: PodTemplate) -> bool:
    """Whether the rendered trainer command injects any fault (a fault-free overlay injects none)."""
    return any(arg.startswith("--fault=") for arg in pod.trainer.argv)


def faults_recovered(result: dict[str, Any], expected: bool) -> bool:
    """Every injected fault recovered, and at least one fired when the values inject any (a demo whose
    faults never fired proved nothing)."""
    return all(f["recovered"] for f in result["faults"]) and (bool(result["faults"]) or not expected)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.demo", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--teams", type=Path, default=REPO / "teams.yaml", help="teams file (first = default)"
    )
    parser.add_argument(
        "--values",
        type=Path,
        action="append",
        help="chart values layered over the synthesized ones, in order (repeatable; default "
        "tools/demo-values.yaml)",
    )
    parser.add_argument(
        "--set", dest="sets", action="append", default=[], help="a helm --set after the values files"
    )
    parser.add_argument("--out", type=Path, default=REPO / "out/demo", help="output directory")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds before the run is abandoned")
    parser.add_argument(
        "--kill",
        action="append",
        default=[],
        metavar="PROCESS:step=N[:pod=I]",
        help="SIGKILL one of a pod's processes from outside at a step (tools/podkill.py; repeatable): "
        f"{', '.join(podkill.PROCESSES)} (exporter: only with a metricsPort)",
    )
    args = parser.parse_args(argv)
    try:
        kills = tuple(podkill.parse(spec) for spec in args.kill)  # pod indexes: once rendered, below
    except ValueError as exc:
        parser.error(str(exc))

    out = fresh_dir(args.out)
    team = default_team(args.teams.resolve())
    say(f"1/4 synthesize the environment of team '{team['name']}' ({args.teams})")
    release = synthesize(args.teams.resolve(), team, out)
    values = [p.resolve() for p in args.values or [REPO / "tools/demo-values.yaml"]]
    ok, _ = run_demo(release, values, args.sets, out, args.timeout, kills, kill_specs=args.kill)
    say(STAND_IN_NOTE)
    return 0 if ok else 1


def fresh_dir(path: Path) -> Path:
    """`path` emptied: a fresh run (old checkpoints would make it resume, not train)."""
    out = path.resolve()
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    return out


def run_demo(
    release: dict[str, Any],
    values: list[Path],
    sets: list[str],
    out: Path,
    timeout_s: float,
    kills: tuple[podkill.Kill, ...] = (),
    kill_specs: list[str] | None = None,
) -> tuple[bool, dict[str, Any]]:
    """Steps 2-4 of the demo for one synthesized release: render with `values` and `sets`, run, report.
    Returns whether the job succeeded with every injected fault recovered, and the report. A kill spec
    naming a pod the rendered job does not have ends the demo (before anything runs)."""
    say("2/4 render the trainer chart with the synthesized values + " + " + ".join(map(str, values)))
    pod = render(release, values, out, sets)
    say("3/4 run the pod command locally (CPU, gloo)")
    npods = int(pod.trainer.env.get("MAX_NNODES", pod.trainer.env["NNODES"]))
    try:
        podkill.parse_all(kill_specs or [], pods=npods)
    except ValueError as exc:
        raise SystemExit(f"demo: {exc}") from None
    job_ok = run_pods(pod, out, timeout_s, kills)
    say("4/4 report")
    result = report(out / "fsx" / "runs", out, job_ok, int(pod.trainer.env["NPROC_PER_NODE"]))
    return job_ok and faults_recovered(result, injects_faults(pod)), result


if __name__ == "__main__":
    sys.exit(main())
