"""Snapshot cost: what a host-memory snapshot blocks, what it holds, and how fast each source restores.

    python -m bench.snapshot [--mib 64 256 ...] [--reps 5] [--dir /dev/shm/...] --out results.json

For each size (MiB of model + AdamW state per rank) one process builds a stack of linear layers whose
parameters and two AdamW moments take that much, runs one optimizer step (so the moments exist), and
measures with the real trainer.snapshot code:
- floor_s:       one copy of the same tensors into preallocated host buffers (the least any snapshot
                 can block: the one-copy floor the issue compares against);
- blocked_s:     Snapshots.after_step as the loop sees it (the save dict, built or reused, and the copy;
                 the checksum and header follow in a background thread, so they do not count unless the
                 next snapshot has to wait for them);
                 blocked_over_floor is the median of each snapshot's ratio to the floor copy before it;
- commit_s:      that background part (CRC32 of the payload + header), measured by the following wait();
- restore memory: offers (headers) + load + set_state_dict, same process (tier 1): the load checks the
                 payload's XXH3-128 first, the process's own slot included (bench.restore_verify
                 measures what that check adds);
- restore shm:   the same from a fresh SnapshotStore on the files (what a restarted worker does): the
                 load checks the payload's XXH3-128 before copying it;
- restore_over_floor: each restore from memory or shm against a floor copy beside it (the issue's
                 target: restore from memory <= 2x a plain memcpy of the same bytes);
- restore fsx:   CheckpointManager.load_latest of a sync DCP checkpoint of the same state (local disk here);
- host_bytes:    the two slots a rank keeps (double buffering), the extra host memory per rank.
With ``--faults N`` it also runs bench.recovery's faulted training runs with snapshots every step
(the chart's ``snapshotInterval: 1``), N repetitions of each of
FAULT_SCENARIOS, and records per fault the tier, where the restore came from (summary.json's
``restored_from``), the steps recomputed and the MTTR: the rollback per fault the planner reads
(``python -m goodput --rollback-from``). POD_FAULT_SCENARIOS adds bench.recovery_pods' node loss with
snapshots replicated to the other node: its ``restored_from`` is where the lost node's ranks restored
from (``peer``: the survivor's replica), the rollback of the planner's node-loss tier.
One gloo rank (the codec stores local shards; sharding does not change the per-rank cost). Timings on a
shared 2-core machine are noisy: read the medians with their spread.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.stats import spread

LAYER_DIM = 512  # one Linear(512, 512): 1 MiB of fp32 weights, 3 MiB with AdamW's two moments


def _state(mib: int) -> dict[str, Any]:
    import torch

    layers = max(1, mib // 3)
    model = torch.nn.Sequential(*[torch.nn.Linear(LAYER_DIM, LAYER_DIM, bias=False) for _ in range(layers)])
    optim = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(4, LAYER_DIM)).sum().backward()
    optim.step()
    optim.zero_grad(set_to_none=True)
    return {"model": model, "optim": optim}


def measure(mib: int, reps: int, shm: Path, ckpt_dir: Path) -> dict[str, Any]:
    import torch

    from trainer.checkpoint import CheckpointConfig, CheckpointManager
    from trainer.snapshot.config import SnapshotConfig
    from trainer.snapshot.manager import Snapshots
    from trainer.snapshot.store import HEADER_BYTES, SnapshotStore
    from trainer.state import codec
    from trainer.state.save_dict import apply_loaded, build_save_dict

    state = _state(mib)
    save = build_save_dict(state, 0)
    _, tensors = codec.flatten(save)
    buffers = [torch.empty_like(t) for t in tensors]
    snaps = Snapshots(
        SnapshotConfig(interval_steps=1, dir=shm, replication=False),
        rank=0,
        world_size=1,
        fingerprint="bench",
    )
    store = snaps.store
    assert store is not None
    snaps.after_step(-1, state)  # warm-up: the first write allocates the tmpfs pages
    store.wait()
    floor, blocked, commit = [], [], []
    for i in range(reps):
        t0 = time.perf_counter()
        for b, t in zip(buffers, tensors, strict=True):
            b.copy_(t)
        floor.append(time.perf_counter() - t0)
        result = snaps.after_step(i, state)
        assert result is not None
        blocked.append(result.blocked_s)
        t1 = time.perf_counter()
        store.wait()
        commit.append(time.perf_counter() - t1)
    payload = result.bytes

    def restore_from(s: SnapshotStore) -> float:
        t0 = time.perf_counter()
        (offer, *_), _ = s.offers(verify_payload=False)  # as trainer/recovery/restore.py: load checks
        template = build_save_dict(state, 0)
        skel, ts = codec.flatten(template)
        apply_loaded(state, s.load(offer, template, codec.layout_id(skel, codec.plan(ts)[0])), 0)
        return time.perf_counter() - t0

    def floor_copy() -> float:
        t0 = time.perf_counter()
        for b, t in zip(buffers, tensors, strict=True):
            b.copy_(t)
        return time.perf_counter() - t0

    # Each restore beside a floor copy just before it (the paired ratio of the snapshots above).
    memory, shm_times, restore_floor = [], [], []
    for _ in range(reps):
        restore_floor.append(floor_copy())
        memory.append(restore_from(store))
    for _ in range(reps):
        fresh = SnapshotStore(shm, rank=0, world_size=1, fingerprint="bench")
        shm_times.append(restore_from(fresh))
        fresh.close()
        restore_floor.append(floor_copy())
    ckpt = CheckpointManager(CheckpointConfig(dir=ckpt_dir, mode="sync"), rank=0, world_size=1)
    ckpt.save(0, state)
    fsx = []
    for _ in range(reps):
        t0 = time.perf_counter()
        ckpt.load_latest(state)
        fsx.append(time.perf_counter() - t0)
    ckpt.close()
    store.remove()
    return {
        "mib": mib,
        "payload_bytes": payload,
        "host_bytes": 2 * (payload + HEADER_BYTES),
        "floor_s": spread(floor),
        "blocked_s": spread(blocked),
        # Each snapshot against the floor copy just before it: on a shared machine the load drifts between
        # repetitions, and a paired ratio cancels what both of a pair saw.
        "blocked_over_floor": statistics.median(b / f for b, f in zip(blocked, floor, strict=True)),
        "commit_s": spread(commit),
        "restore_s": {"memory": spread(memory), "shm": spread(shm_times), "fsx": spread(fsx)},
        # Restores from host memory against the floor copy beside each (target: memory <= 2x).
        "restore_over_floor": {
            "memory": statistics.median(r / f for r, f in zip(memory, restore_floor[:reps], strict=True)),
            "shm": statistics.median(r / f for r, f in zip(shm_times, restore_floor[reps:], strict=True)),
        },
    }


# bench.recovery scenarios whose fault a snapshot should absorb: tier 1 (the process's memory) and a
# worker restart (the pod's /dev/shm).
FAULT_SCENARIOS = ("exception/tier1", "exception/tier2", "sigkill/tier2")
# bench.recovery_pods scenarios: a whole node lost (2 pods x 1 rank and a hot spare), its state restored
# from the replica on the surviving node.
POD_FAULT_SCENARIOS = ("node-loss/peer",)


def measure_faults(reps: int, work: Path) -> list[dict[str, Any]]:
    """Faulted runs with snapshots every step: per fault its restore source and steps recomputed."""
    from bench import recovery

    cfg = recovery.RecoveryConfig(snapshot_interval=1)
    res = recovery.run(list(FAULT_SCENARIOS), reps, work, cfg)
    out = []
    for rec in res["runs"]:
        summary = Path(rec["out_dir"]) / "summary.json"
        faults = json.loads(summary.read_text()).get("faults") or [] if summary.is_file() else []
        first = faults[0] if faults else {}
        out.append(
            {
                "scenario": rec["scenario"],
                "rep": rec["rep"],
                "ok": bool(rec.get("ok")),
                "tier": rec.get("tier"),
                "restored_from": first.get("restored_from"),
                "steps_recomputed": rec.get("steps_recomputed"),
                "mttr_s": rec.get("mttr_s"),
                "unplanned_restarts": rec.get("unplanned_restarts"),
            }
        )
    return out + measure_node_loss(reps, work / "pods")


def measure_node_loss(reps: int, work: Path) -> list[dict[str, Any]]:
    """POD_FAULT_SCENARIOS: per node loss where the lost node's ranks restored from (``restored_from``),
    where every rank did (``restored_by_source``) and the steps recomputed."""
    from bench import recovery_pods

    res = recovery_pods.run(list(POD_FAULT_SCENARIOS), reps, work, recovery_pods.PodsConfig())
    out = []
    for rec in res["runs"]:
        first = (rec.get("faults") or [{}])[0]
        out.append(
            {
                "scenario": rec["scenario"],
                "rep": rec["rep"],
                "ok": bool(rec.get("ok")) and first.get("lost_restored_from") is not None,
                "tier": first.get("tier"),
                "restored_from": first.get("lost_restored_from"),
                "restored_by_source": first.get("restored_by_source"),
                "steps_recomputed": first.get("steps_recomputed"),
                "mttr_s": rec.get("mttr_s"),
                "unplanned_restarts": rec.get("unplanned_pod_restarts"),
            }
        )
    return out


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.snapshot", description=__doc__.splitlines()[0])
    p.add_argument("--mib", type=int, nargs="+", default=[64, 256], help="MiB of state per rank")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--dir", type=Path, default=Path("/dev/shm"), help="tmpfs for the snapshot slots")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument(
        "--faults", type=int, default=0, help="repetitions of the faulted runs with snapshots (0: none)"
    )
    p.add_argument("--work", type=Path, default=Path("out/bench/snapshot"), help="the faulted runs' folder")
    args = p.parse_args(argv)
    if any(m < 3 for m in args.mib) or args.reps < 1 or args.faults < 0:
        p.error("--mib: each >= 3; --reps: >= 1; --faults: >= 0")
    import socket

    import torch.distributed as dist

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=0, world_size=1)  # the checkpoint manager needs a group
    rows = []
    try:
        for mib in args.mib:
            with tempfile.TemporaryDirectory(dir=args.dir) as shm, tempfile.TemporaryDirectory() as ckpt:
                row = measure(mib, args.reps, Path(shm), Path(ckpt))
            rows.append(row)
            r = row["restore_s"]
            print(
                f"{mib:>5} MiB/rank: blocked {row['blocked_s']['median'] * 1e3:.1f} ms "
                f"(floor {row['floor_s']['median'] * 1e3:.1f} ms, x{row['blocked_over_floor']:.2f}), "
                f"commit {row['commit_s']['median'] * 1e3:.1f} ms, host {row['host_bytes'] / 2**20:.0f} MiB, "
                f"restore memory {r['memory']['median']:.3f} s (x{row['restore_over_floor']['memory']:.2f}) "
                f"shm {r['shm']['median']:.3f} s (x{row['restore_over_floor']['shm']:.2f}) "
                f"fsx {r['fsx']['median']:.3f} s",
                flush=True,
            )
    finally:
        dist.destroy_process_group()
    faults = measure_faults(args.faults, args.work) if args.faults else []
    for f in faults:
        print(
            f"fault {f['scenario']} rep {f['rep']}: ok={f['ok']} restored from {f['restored_from']}, "
            f"{f['steps_recomputed']} steps recomputed",
            flush=True,
        )
    out = {
        "rows": rows,
        "faults": faults,
        "config": {"reps": args.reps, "dir": str(args.dir), "cpus": os.cpu_count(), "host": platform.node()},
        "note": "one CPU rank; /dev/shm tmpfs; fsx = local disk here",
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
