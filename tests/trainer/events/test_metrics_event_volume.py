"""Per-step event bytes per node do not grow with the ranks per node (Contract 3): the real
EventLog, driven with exactly the per-step emits of the loop (trainer/runtime/job.py) and the replica
sender (trainer/snapshot/replica.py), at 1, 2 and 8 ranks per node."""

from __future__ import annotations

from pathlib import Path

from trainer.events.metrics import EventLog, read_events

STEPS = 20


def _node_bytes(out: Path, node: int, ranks_per_node: int, *, failed_replica_rank: int | None = None) -> int:
    """Bytes node `node`'s ranks append over STEPS steps with a snapshot (and its replica) every step."""
    logs = [EventLog(out, node * ranks_per_node + local, local_rank=local) for local in range(ranks_per_node)]
    before = sum(log.path.stat().st_size for log in logs)
    for step in range(STEPS):
        for log in logs:
            if log.rank == 0:
                log.emit("step", step=step, t_start=1.0, t_end=2.0, loss=1.5, tokens=4096)
            log.emit("snapshot", step=step, blocked_s=0.01, copy_s=0.05, bytes=1 << 20)
            ok = log.rank != failed_replica_rank
            log.emit("replica", step=step, holder=0, bytes=1 << 20, send_s=0.1, ok=ok,
                     **({} if ok else {"error": "refused"}))  # fmt: skip
    after = sum(log.path.stat().st_size for log in logs)
    for log in logs:
        log.close()
    return after - before


def test_per_step_bytes_per_node_do_not_grow_with_ranks_per_node(tmp_path: Path) -> None:
    per_node = {k: _node_bytes(tmp_path / f"k{k}", 1, k) for k in (1, 2, 8)}
    assert per_node[1] > 0
    # Only local rank 0 writes per-step events (lines differ by the digits of `t` and `pid` only).
    slack = 16 * 2 * STEPS
    assert abs(per_node[8] - per_node[1]) <= slack and abs(per_node[2] - per_node[1]) <= slack, per_node
    rank0_node = {k: _node_bytes(tmp_path / f"r{k}", 0, k) for k in (1, 8)}
    assert abs(rank0_node[8] - rank0_node[1]) <= slack + 16 * STEPS, rank0_node
    assert 0 < rank0_node[1] - per_node[1] < 200 * STEPS  # plus rank 0's one `step` a step, nothing more


def test_failures_are_written_by_every_rank(tmp_path: Path) -> None:
    _node_bytes(tmp_path, 1, 4, failed_replica_rank=6)
    events, bad = read_events(tmp_path)
    failed = [e for e in events if e["ev"] == "replica" and not e["ok"]]
    assert bad == 0 and {e["rank"] for e in failed} == {6} and len(failed) == STEPS
    assert {e["rank"] for e in events if e["ev"] == "snapshot"} == {4}  # the node's local rank 0
