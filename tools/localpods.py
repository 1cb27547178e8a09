"""Run Kubernetes-style "pods" as local process trees, and an Indexed-Job-like controller over them.

Split by job: tools/localpod.py (one pod: a process tree found by an inherited marker, killed whole like a
lost node), tools/localjob.py (the Job controller: replacements, backoff, FailJob codes), and this module,
the command line (and the names most callers import, re-exported).

Usage:

    job = LocalJob([PodSpec("pod-0", argv0, env0, log0), PodSpec("pod-1", argv1, env1, log1)])
    with job:
        job.start()
        ...
        job.kill_pod(1)            # node lost: the controller starts pod-1 again
        result = job.wait(timeout_s=120)

From the shell (`{port}`: a free rendezvous port, `{index}`: the pod index):

    python -m tools.localpods --pods 2 --kill 1@40 -- ft_launcher --nnodes=2 ... \
        --rdzv-endpoint=127.0.0.1:{port} ... -m trainer ...
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from tools.localjob import JobResult, LocalJob, PodExit, PodSpec
from tools.localpod import LOCAL_POD_ENV, POD_MARKER_ENV, LocalPod
from tools.podcommand import LocalPlaces
from trainer.runtime.ports import free_port

__all__ = [
    "LOCAL_POD_ENV",
    "POD_MARKER_ENV",
    "JobResult",
    "LocalJob",
    "LocalPod",
    "PodExit",
    "PodSpec",
    "main",
    "node_places",
    "node_pod_spec",
]


# -- one node per pod: node-local places -----------------------------------------------------------------
def node_places(places: LocalPlaces, index: int) -> LocalPlaces:
    """The places of the pod with Job index ``index``: the shared ones of ``places`` (data, output, the
    FSx checkpoint) and node-local folders of its own, as each pod of the Job runs on a node of its own:
    the NVMe tier (``<out>-node<index>-local``) and /dev/shm (``<out>-node<index>-shm``). One folder for
    every pod would let a replaced node restore from a copy (`local`, `shm`) that only its lost
    predecessor had: a real replacement is another machine and finds neither."""
    out = places.out_dir
    return replace(
        places,
        local_ckpt_dir=out.parent / f"{out.name}-node{index}-local",
        snapshot_dir=out.parent / f"{out.name}-node{index}-shm",
    )


def node_pod_spec(
    name: str, argv: Sequence[str], env: Mapping[str, str], log_path: Path, places: LocalPlaces
) -> PodSpec:
    """A pod on a node of its own (``places`` from node_places): its node-local folders are emptied
    before each pod of its index starts, so a replacement pod (a new node after a node loss) restores
    from a peer or the shared checkpoint, never from what the lost pod left behind. (A worker restart
    inside a pod keeps both: ft_launcher restarts processes, not the pod.)"""
    node_dirs = tuple(d for d in (places.local_ckpt_dir, places.snapshot_dir) if d is not None)
    return PodSpec(name, argv, env, log_path, fresh_dirs=node_dirs)


# -- command line: run any command as N local pods -----------------------------------------------------
def main(argv: Sequence[str] | None = None) -> int:
    """`python -m tools.localpods --pods N [--kill INDEX@SECONDS] -- COMMAND...`; returns 0 on success.

    `{index}` and `{port}` in COMMAND become the pod index and a free rendezvous port (pod 0 is started
    first and must listen on it). Example, 2 pods x 2 ranks of the trainer:

        python -m tools.localpods --pods 2 --kill 1@40 -- ft_launcher --nnodes=2 --nproc-per-node=2 \\
            --rdzv-backend=c10d --rdzv-endpoint=127.0.0.1:{port} --rdzv-id=local --max-restarts=3 \\
            -m trainer --out-dir=out/local --device=cpu -- --data-path=out/tokens.npy
    """
    import argparse

    parser = argparse.ArgumentParser(prog="python -m tools.localpods", description=main.__doc__)
    parser.add_argument("--pods", type=int, default=2, help="pods (Job indexes) to run")
    parser.add_argument("--log-dir", type=Path, default=Path("out/localpods"), help="pod-<index>.log go here")
    parser.add_argument("--backoff-limit", type=int, default=3, help="pod failures tolerated")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds before every pod is killed")
    parser.add_argument(
        "--kill", action="append", default=[], metavar="INDEX@SECONDS", help="lose pod INDEX after SECONDS"
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the pod command")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("command: give the pod command after --")
    if args.pods < 1:
        parser.error("--pods: must be >= 1")
    kills: list[tuple[float, int]] = []
    for item in args.kill:
        index, sep, seconds = item.partition("@")
        if not sep or not index.isdigit() or int(index) >= args.pods:
            parser.error(f"--kill: expected INDEX@SECONDS with INDEX < {args.pods}, got {item!r}")
        kills.append((float(seconds), int(index)))
    port = free_port()
    specs = [
        PodSpec(
            f"pod-{i}",
            [part.replace("{index}", str(i)).replace("{port}", str(port)) for part in command],
            dict(os.environ),
            args.log_dir / f"pod-{i}.log",
        )
        for i in range(args.pods)
    ]
    uses_port = any("{port}" in part for part in command)

    def say(kind: str, fields: dict[str, Any]) -> None:
        print(f"{time.strftime('%H:%M:%S')} {kind} {fields}", flush=True)

    job = LocalJob(
        specs, backoff_limit=args.backoff_limit, host_port=port if uses_port else None, on_event=say
    )
    with job:
        job.start()
        started = time.monotonic()
        pending = sorted(kills)
        result = None
        while result is None and time.monotonic() - started < args.timeout:
            while pending and time.monotonic() - started >= pending[0][0]:
                _, index = pending.pop(0)
                say("pod_kill", {"index": index, "pids": sorted(job.kill_pod(index))})
            result = job.poll()
            time.sleep(0.2)
    if result is None:
        print(f"job: timed out after {args.timeout:.0f} s (every pod killed)", flush=True)
        return 1
    print(f"job: {'succeeded' if result.succeeded else 'failed'} ({result.reason})", flush=True)
    return 0 if result.succeeded else 1


if __name__ == "__main__":
    raise SystemExit(main())
