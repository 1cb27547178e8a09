"""Measure peer replication of snapshots on this machine: 2 "nodes" x 1 gloo rank (spawned processes).

Each rank trains a real FSDP2 model (a trainer preset) with snapshots every step, once with peer
replication and once without, and reports per rank: time and bytes per replication (send until the
holder stored and verified it), the loop's blocked time per snapshot with and without replication, the
step time with and without, and the host memory its snapshot directory holds (own slots + the replicas
it keeps). Prints medians and ranges.

    .venv/bin/python -m tools.measure_replication --preset tiny --steps 30
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

MiB = 1 << 20


def _rank(rank: int, world_size: int, port: int, preset: str, steps: int, root: str, out: str) -> None:
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.distributed.device_mesh import init_device_mesh

    from trainer.recovery.restore import restore_attempt
    from trainer.reference.model import PRESETS, build_model
    from trainer.snapshot.config import SnapshotConfig
    from trainer.snapshot.manager import Snapshots

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), LOCAL_WORLD_SIZE="1")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    mesh = init_device_mesh("cpu", (world_size,))
    cfg = PRESETS[preset]
    result: dict[str, Any] = {"rank": rank}
    for replication in (True, False):
        model = build_model(cfg, mesh=mesh, device=torch.device("cpu"), seed=0)
        optim = torch.optim.AdamW(model.parameters(), lr=1e-4)

        class Trainer:
            step = -1

            def state_dict(self) -> dict[str, Any]:
                return {"step": self.step}

            def load_state_dict(self, sd: dict[str, Any]) -> None:
                self.step = int(sd["step"])

        state: dict[str, Any] = {"model": model, "optim": optim, "trainer": Trainer()}
        snap_cfg = SnapshotConfig(
            interval_steps=1, dir=Path(root) / f"{replication}-node{rank}", replication=replication
        )
        snaps = Snapshots(snap_cfg, rank=rank, world_size=world_size, fingerprint=preset)
        events = _Events()
        restore_attempt(snaps, _NoCheckpoint(Path(root)), state, torch.device("cpu"), events)
        gen = torch.Generator().manual_seed(rank)
        step_s, blocked_s = [], []
        for step in range(steps):
            t0 = time.perf_counter()
            tokens = torch.randint(0, cfg.vocab_size, (2, 65), generator=gen)
            logits = model(tokens[:, :-1])
            F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()).backward()
            optim.step()
            optim.zero_grad(set_to_none=True)
            state["trainer"].step = step
            snap = snaps.after_step(step, state)
            step_s.append(time.perf_counter() - t0)
            assert snap is not None
            blocked_s.append(snap.blocked_s)
            snap_bytes = snap.bytes
        if snaps.peers is not None:
            snaps.peers.flush(timeout_s=120)
        dist.barrier()
        directory = snap_cfg.dir
        own = sum(p.stat().st_size for p in directory.glob("rank*.slot*"))
        held = sum(p.stat().st_size for p in (directory / "replicas").glob("rank*.slot*"))
        sent = [e for e in events.seen if e["ev"] == "replica"]
        key = "on" if replication else "off"
        result[key] = {
            "snapshot_bytes": snap_bytes,
            "step_s": step_s[1:],  # the first step builds the optimizer state and maps the slots
            "blocked_s": blocked_s[1:],
            "replica_send_s": [e["send_s"] for e in sent if e["ok"]],
            "replica_bytes": [e["bytes"] for e in sent if e["ok"]],
            "replicas_sent": len([e for e in sent if e["ok"]]),
            "replicas_failed": len([e for e in sent if not e["ok"]]),
            "shm_own_bytes": own,
            "shm_replica_bytes": held,
        }
        dist.barrier()
        snaps.finish()
        dist.barrier()
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


class _Events:
    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []

    def emit(self, ev: str, **fields: Any) -> None:
        self.seen.append({"ev": ev, **fields})


class _NoCheckpoint:
    """Nothing durable here: the restore finds snapshots or nothing."""

    def __init__(self, root: Path) -> None:
        self.cfg = argparse.Namespace(dir=root / "no-ckpt")
        self.manager = argparse.Namespace(local=None)  # no node-local tier either

    def restore(self, _state: Any) -> int:
        return -1


def _summary(values: list[float], scale: float = 1.0, unit: str = "") -> str:
    if not values:
        return "n/a"
    v = [x * scale for x in values]
    return f"median {statistics.median(v):.3f}{unit} (range {min(v):.3f}-{max(v):.3f}, n={len(v)})"


def main() -> None:
    import torch.multiprocessing as mp

    from trainer.runtime.ports import free_port

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="tiny", choices=("tiny", "small"))
    parser.add_argument("--steps", type=int, default=30)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir="/dev/shm") as root, tempfile.TemporaryDirectory() as out:
        mp.start_processes(
            _rank, args=(2, free_port(), args.preset, args.steps, root, out), nprocs=2, start_method="spawn"
        )
        results = [json.loads(Path(out, f"rank{r}.json").read_text()) for r in range(2)]
    print(f"preset {args.preset}, {args.steps} steps, 2 nodes x 1 rank (gloo, 127.0.0.1)")
    for r in results:
        on, off = r["on"], r["off"]
        ms, mib = 1e3, 1 / MiB
        print(f"rank {r['rank']}: snapshot {on['snapshot_bytes'] * mib:.1f} MiB")
        print(f"  replication: {on['replicas_sent']} sent, {on['replicas_failed']} failed")
        print(f"  time per replica {_summary(on['replica_send_s'], ms, ' ms')}")
        print(f"  bytes per replica {_summary(on['replica_bytes'], mib, ' MiB')}")
        print(f"  blocked per snapshot, replication on:  {_summary(on['blocked_s'], ms, ' ms')}")
        print(f"  blocked per snapshot, replication off: {_summary(off['blocked_s'], ms, ' ms')}")
        print(f"  step time, replication on:  {_summary(on['step_s'], ms, ' ms')}")
        print(f"  step time, replication off: {_summary(off['step_s'], ms, ' ms')}")
        own, kept = on["shm_own_bytes"] * mib, on["shm_replica_bytes"] * mib
        print(
            f"  /dev/shm held: own {own:.1f} MiB + replicas kept {kept:.1f} MiB "
            f"(off: {off['shm_own_bytes'] * mib:.1f} MiB)"
        )


if __name__ == "__main__":
    main()
