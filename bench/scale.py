"""How the control path and the run's bookkeeping grow with the job, measured by simulation.

    python -m bench.scale [--size tiny|quick|full] --out scale.json

No torch process group and no training: many lightweight clients drive the real rendezvous store
(torch.distributed.TCPStore, the c10d store ft_launcher hosts on pod 0) with the operations the code
issues per round, and the real exporter reads synthetic event files in the trainer's format:

- rendezvous: one round of NVRx 0.7's barrier rendezvous (ft_rendezvous_barrier.py, perform_rendezvous)
  for N nodes. Every node: step 0 (is_shutdown: check+get; check+get of round_done), step 1
  (add(join_count); per-key fenced compare_set of its rank key and its slot key, each check+get+
  compare_set), step 3 (_check_timeout_and_closure's check+get of the shutdown key, get(round_done), then
  check+get of its rank key). The store host's step 2: check of the unhealthy count, check+get of
  join_count, check of all N slot keys, multi_get of them, get(join_count) again, multi_set of N rank
  keys, set(round_done). Measured: the join phase (all N nodes concurrently), the host's close, the
  operations the store serves. The polls' sleeps (0.1 s by the host and by every node) are constants of
  the code, added in the model, not slept here.
- liveness: one poll of the node beats (trainer/launcher/beat.py, resilience/liveness.py): N launchers'
  LauncherBeat set,
  the two watchers' real RoundWatch.check (check+get of N keys each), and every rank's check of the
  verdict key. Measured: a watcher's poll (its detection granularity) and the store's operations.
- restore agreement (trainer/recovery/restore.py): the all_gather row per rank and what each rank then
  does with W rows (tolist, the sets of steps, their intersection), timed on synthetic rows.
- exporter: a run of R ranks (8 per node) x S steps written with bench.scale_events, folded once, then
  10 more steps (one snapshot) appended and scraped: lines parsed, records held and wall time of that
  scrape (median of 3), against
  R and against S; the former exporter re-parsed every line at every scrape (its cost is the file's
  line count).
- event log: bytes appended to FSx per step per node under Contract 3, and with every rank writing
  its own snapshot and replica events.

Each series is fitted as y = a x^k on log-log axes (least squares); the projection to 2,048 nodes x 8
ranks extrapolates the fit where the measured sizes stop short.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

RANKS_PER_NODE = 8
TARGET_NODES = 2048
SIZES: dict[str, dict[str, Sequence[int]]] = {
    # nodes for the store simulations; ranks and steps for the exporter and the event log
    "tiny": {"nodes": (4, 8, 16), "ranks": (16, 32, 64), "steps": (200, 400, 800)},
    "quick": {"nodes": (8, 32, 128), "ranks": (64, 256, 1024), "steps": (500, 1000, 2000, 4000)},
    "full": {
        "nodes": (8, 32, 128, 512, 2048),
        "ranks": (64, 256, 1024, 4096, 16384),
        "steps": (1000, 2000, 4000, 8000),
    },
}
CLIENT_THREADS = 32  # simulated nodes are spread over this many threads, each node with its own connection
REPEATS = 3  # timed work that takes milliseconds: the min (restore) or median (scrape) of this many
HOST_POLL_S = 0.1  # NVRx 0.7 barrier rendezvous: the host polls join_count, every node polls round_done
PARTICIPANT_BYTES = 160  # a packed participant value (node descriptor, infra rank, domain, round): ~this


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _store_server() -> tuple[Any, int]:
    from torch.distributed import TCPStore

    port = _free_port()
    server = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=_td(60))
    return server, port


def _td(seconds: float) -> Any:
    import datetime as dt

    return dt.timedelta(seconds=seconds)


def _client(port: int) -> Any:
    from torch.distributed import TCPStore

    return TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False, timeout=_td(60))


def _clients(port: int, n: int) -> list[Any]:
    """n client connections, opened concurrently: now and then a connect stalls ~5 s on a loaded host
    (seen with both of TCPStore's server loops), and serially that would dominate the part's runtime."""
    out: list[Any] = [None] * n

    def connect(i: int) -> int:
        out[i] = _client(port)
        return 0

    _parallel(n, connect, threads=4 * CLIENT_THREADS)
    return out


def _parallel(n: int, work: Callable[[int], int], threads: int = CLIENT_THREADS) -> tuple[float, int]:
    """Run work(i) for i in range(n) on up to CLIENT_THREADS threads; (wall seconds, summed op counts)."""
    threads = min(n, threads)
    counts = [0] * threads

    def run(t: int) -> None:
        for i in range(t, n, threads):
            counts[t] += work(i)

    pool = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
    t0 = time.perf_counter()
    for th in pool:
        th.start()
    for th in pool:
        th.join()
    return time.perf_counter() - t0, sum(counts)


def rendezvous_round(nodes: int) -> dict[str, Any]:
    """One barrier-rendezvous round of `nodes` nodes against a real TCPStore (module doc)."""
    _server, port = _store_server()  # kept referenced: the store lives as long as the measurement
    prefix = "rdzv/r0"
    host = _client(port)
    clients = _clients(port, nodes)
    host.set(f"{prefix}:shutdown", b"")
    host.set(f"{prefix}:round_done_0", b"0")
    payload = b"x" * PARTICIPANT_BYTES
    slots: list[int] = [0] * nodes

    def fenced_set(store: Any, key: str, value: bytes) -> int:
        old = store.get(key) if store.check([key]) else b""
        store.compare_set(key, old, value)
        return 3 if old else 2

    def join(i: int) -> int:
        s = clients[i]
        ops = 0
        s.check([f"{prefix}:shutdown"])
        s.get(f"{prefix}:shutdown")
        s.check([f"{prefix}:round_done_0"])
        s.get(f"{prefix}:round_done_0")
        slot = s.add(f"{prefix}:join_count", 1)
        slots[i] = slot
        ops += 5
        ops += fenced_set(s, f"{prefix}:slot_{slot}_rank", b"-1,0,0")
        ops += fenced_set(s, f"{prefix}:slot_{slot}", payload)
        return ops

    join_s, join_ops = _parallel(nodes, join)

    t0 = time.perf_counter()
    host.check([f"{prefix}:unhealthy_count"])
    host.check([f"{prefix}:join_count"])
    joined = int(host.get(f"{prefix}:join_count"))
    keys = [f"{prefix}:slot_{i}" for i in range(1, joined + 1)]
    assert host.check(keys)
    values = host.multi_get(keys)
    int(host.get(f"{prefix}:join_count"))
    host.multi_set([k + "_rank" for k in keys], [f"{r},{joined},0".encode() for r in range(joined)])
    host.set(f"{prefix}:round_done_0", b"1")
    close_s = time.perf_counter() - t0
    close_ops = 8
    snapshot_bytes = sum(len(v) for v in values)

    def read_rank(i: int) -> int:
        s = clients[i]
        s.check([f"{prefix}:shutdown"])
        s.get(f"{prefix}:shutdown")
        s.get(f"{prefix}:round_done_0")
        key = f"{prefix}:slot_{slots[i]}_rank"
        s.check([key])
        s.get(key)
        return 5

    read_s, read_ops = _parallel(nodes, read_rank)
    return {
        "nodes": nodes,
        "join_s": join_s,
        "close_s": close_s,
        "read_s": read_s,
        "store_ops": join_ops + close_ops + read_ops,
        "snapshot_bytes": snapshot_bytes,
        # The round as a launcher sees it: the joins, the host's poll, its close, every node's poll, the
        # reads; last_call_timeout (hot spares only) and the join timeout's waits for late pods excluded.
        "round_s": join_s + HOST_POLL_S + close_s + HOST_POLL_S + read_s,
    }


def liveness_poll(nodes: int) -> dict[str, Any]:
    """One poll of the node beats of a round of `nodes` nodes (module doc), with the real classes."""
    from trainer.launcher.beat import LauncherBeat
    from trainer.resilience.liveness import WATCHER_NODES, RoundWatch

    _server, port = _store_server()  # kept referenced: the store lives as long as the measurement
    connections = iter(_clients(port, nodes))
    beats = [
        LauncherBeat(f"127.0.0.1:{port}", store_factory=lambda _e: next(connections)) for _ in range(nodes)
    ]

    def beat(i: int) -> int:
        beats[i].serve(0, i)  # the first beat, then the thread beats every BEAT_INTERVAL_S
        beats[i].stop()
        return 1

    beat_s, beat_ops = _parallel(nodes, beat)
    watchers = [RoundWatch(_client(port), 0, nodes, w, timeout_s=3600.0) for w in range(WATCHER_NODES)]
    t0 = time.perf_counter()
    watchers[0].check()
    watch_s = time.perf_counter() - t0
    for w in watchers[1:]:
        w.check()
    watcher_ops = WATCHER_NODES * (1 + 2 * (nodes - 1))
    verdict = _clients(port, min(nodes, CLIENT_THREADS))
    ranks = nodes * RANKS_PER_NODE

    def look(i: int) -> int:
        verdict[i % len(verdict)].check(["trainer/liveness/0/lost"])
        return 1

    verdict_s, verdict_ops = _parallel(ranks, look)
    return {
        "nodes": nodes,
        "beat_s": beat_s,
        "watcher_poll_s": watch_s,
        "verdict_checks_s": verdict_s,
        "store_ops_per_poll": beat_ops + watcher_ops + verdict_ops,
    }


def restore_agreement(ranks: int) -> dict[str, Any]:
    """The all_gather row of the restore agreement and one rank's work on W rows (module doc)."""
    import torch

    from trainer.recovery.restore import OFFERED
    from trainer.snapshot.replica import ROW

    width = OFFERED + 1 + ROW
    rows = [torch.full((width,), 7, dtype=torch.int64) for _ in range(ranks)]
    times = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        table = [r.tolist() for r in rows]
        has = [{s for s in r[:OFFERED] if s >= 0} for r in table]
        for row in table:  # as PeerReplicas.learn reads the replicas each holder keeps
            pairs = row[OFFERED + 3 :]
            for owner, step in zip(pairs[0::2], pairs[1::2], strict=True):
                if 0 <= owner < ranks and step >= 0:
                    has[owner].add(step)
        set.intersection(*has)
        times.append(time.perf_counter() - t0)
    work_s = min(times)
    return {"ranks": ranks, "row_bytes": width * 8, "gathered_bytes_per_rank": width * 8 * ranks,
            "per_rank_work_s": work_s}  # fmt: skip


def _lines(out: Path) -> int:
    return sum(p.read_bytes().count(b"\n") for p in out.glob("events.rank*.jsonl"))


def exporter_scrape(ranks: int, steps: int, work_dir: Path) -> dict[str, Any]:
    """Fold a run of `ranks` x `steps`, append one step, scrape: cost of that scrape (module doc)."""
    from bench.scale_events import write_run
    from trainer.events.metrics_export import EventTail, fold_families

    out = work_dir / f"run_{ranks}_{steps}"
    shutil.rmtree(out, ignore_errors=True)
    t_end = write_run(out, ranks=ranks, steps=steps, ranks_per_node=RANKS_PER_NODE, completed=False)
    tail = EventTail(out)
    t0 = time.perf_counter()
    tail.poll()
    first_s = time.perf_counter() - t0
    visited = tail.fold.work.records_visited
    times, lines_scraped = [], []
    for k in range(REPEATS):  # one more step each time, a snapshot step (its node-level events included)
        first = steps + 10 * k
        t_end = write_run(out, ranks=ranks, steps=10, first_step=first, t0=t_end,
                          ranks_per_node=RANKS_PER_NODE, completed=False, start=False)  # fmt: skip
        before = tail.fold.work.lines_parsed
        t0 = time.perf_counter()
        tail.poll()
        list(fold_families(tail.fold, t_end + 120.0))
        times.append(time.perf_counter() - t0)
        lines_scraped.append(tail.fold.work.lines_parsed - before)
    scrape_s = sorted(times)[len(times) // 2]
    lines = _lines(out)
    shutil.rmtree(out, ignore_errors=True)
    return {
        "ranks": ranks,
        "steps": steps,
        "first_scrape_s": first_s,
        "scrape_s": scrape_s,
        "scrape_lines": lines_scraped[0],
        "scrape_records_visited": (tail.fold.work.records_visited - visited) / REPEATS,
        "held": tail.fold.held(),
        "lines_in_log": lines,  # what the former exporter re-parsed at every scrape
    }


def event_bytes(ranks: int, work_dir: Path, steps: int = 10) -> dict[str, Any]:
    """Bytes appended per step per node, Contract 3, and with every rank writing its
    own snapshot and replica events (snapshot every step)."""
    from bench.scale_events import write_run

    result: dict[str, Any] = {"ranks": ranks, "nodes": max(1, ranks // RANKS_PER_NODE)}
    for name, per_rank in (("now", False), ("before", True)):
        out = work_dir / f"bytes_{ranks}_{name}"
        shutil.rmtree(out, ignore_errors=True)
        write_run(out, ranks=ranks, steps=1, snapshot_every=1, ckpt_every=0, completed=False,
                  ranks_per_node=RANKS_PER_NODE, per_rank_snapshots=per_rank)  # fmt: skip
        start = {p.name: p.stat().st_size for p in out.glob("*.jsonl")}
        lines0 = _lines(out)
        write_run(out, ranks=ranks, steps=steps, first_step=1, snapshot_every=1, ckpt_every=0, start=False,
                  completed=False, ranks_per_node=RANKS_PER_NODE, per_rank_snapshots=per_rank)  # fmt: skip
        grown = sum(p.stat().st_size - start.get(p.name, 0) for p in out.glob("*.jsonl"))
        result[f"bytes_per_step_per_node_{name}"] = grown / steps / result["nodes"]
        result[f"appends_per_step_{name}"] = (_lines(out) - lines0) / steps
        shutil.rmtree(out, ignore_errors=True)
    return result


def _allow_open_files(need: int) -> None:
    """Raise the soft limit on open files: a synthetic run keeps one file per rank open, a simulated round
    one connection per node (and the store host the other end). Stops naming the limit if it cannot."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= need:
        return
    if hard != resource.RLIM_INFINITY and hard < need:
        raise SystemExit(f"bench.scale needs {need} open files; the hard limit is {hard} (ulimit -Hn)")
    resource.setrlimit(resource.RLIMIT_NOFILE, (need, hard))


def fit(xs: Sequence[float], ys: Sequence[float]) -> dict[str, float] | None:
    """Least-squares y = a x^k on log-log axes: {"k", "a"}; None with fewer than two positive points."""
    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys, strict=True) if x > 0 and y > 0]
    if len(pts) < 2 or len({p[0] for p in pts}) < 2:
        return None
    n = len(pts)
    mx = sum(p[0] for p in pts) / n
    my = sum(p[1] for p in pts) / n
    k = sum((p[0] - mx) * (p[1] - my) for p in pts) / sum((p[0] - mx) ** 2 for p in pts)
    return {"k": k, "a": math.exp(my - k * mx)}


def project(f: dict[str, float] | None, x: float) -> float | None:
    return None if f is None else f["a"] * x ** f["k"]


SERIES: tuple[tuple[str, str, str, str, str], ...] = (
    # (series name, table, x field, y field, unit)
    ("rendezvous round (store work + polls)", "rendezvous", "nodes", "round_s", "s"),
    ("rendezvous join phase", "rendezvous", "nodes", "join_s", "s"),
    ("rendezvous host close", "rendezvous", "nodes", "close_s", "s"),
    ("rendezvous store operations", "rendezvous", "nodes", "store_ops", "ops"),
    ("liveness watcher poll", "liveness", "nodes", "watcher_poll_s", "s"),
    ("liveness store operations per poll", "liveness", "nodes", "store_ops_per_poll", "ops"),
    ("restore agreement bytes received per rank", "restore", "ranks", "gathered_bytes_per_rank", "B"),
    ("restore agreement work per rank", "restore", "ranks", "per_rank_work_s", "s"),
    ("exporter scrape (10 steps appended) vs ranks", "exporter_ranks", "ranks", "scrape_s", "s"),
    ("exporter lines per scrape vs ranks", "exporter_ranks", "ranks", "scrape_lines", "lines"),
    ("exporter lines per scrape vs steps", "exporter_steps", "steps", "scrape_lines", "lines"),
    ("exporter records held vs steps", "exporter_steps", "steps", "held", "records"),
    ("former exporter lines per scrape vs steps", "exporter_steps", "steps", "lines_in_log", "lines"),
    ("event bytes per step per node vs ranks", "event_bytes", "ranks", "bytes_per_step_per_node_now", "B"),
    ("before: event bytes per step per node", "event_bytes", "ranks", "bytes_per_step_per_node_before", "B"),
)


def target_x(x_field: str) -> float:
    return float(TARGET_NODES if x_field == "nodes" else TARGET_NODES * RANKS_PER_NODE)


def fits(tables: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Per series: its exponent and its value projected to 2,048 nodes x 8 ranks (steps: the largest)."""
    out = []
    for name, table, x_field, y_field, unit in SERIES:
        rows = tables.get(table) or []
        xs = [float(r[x_field]) for r in rows]
        ys = [float(r[y_field]) for r in rows]
        f = fit(xs, ys)
        x = max(xs, default=0.0) if x_field == "steps" else target_x(x_field)
        out.append({"series": name, "table": table, "x": x_field, "y": y_field, "unit": unit,
                    "exponent": None if f is None else f["k"], "a": None if f is None else f["a"],
                    "at": x, "projected": project(f, x),
                    "largest_measured": max(xs, default=None)})  # fmt: skip
    return out


def run(size: str, work_dir: Path | None = None) -> dict[str, Any]:
    # Every connection makes c10d look up the peer's name; with no DNS server reachable (this machine)
    # each failed lookup stalls 5 s. Bound it to 1 s (glibc reads RES_OPTIONS at its first lookup).
    os.environ.setdefault("RES_OPTIONS", "timeout:1 attempts:1")
    sizes = SIZES[size]
    _allow_open_files(max(max(sizes["ranks"]), 3 * max(sizes["nodes"])) + 256)
    own_dir = work_dir is None
    work = Path(tempfile.mkdtemp(prefix="bench-scale-")) if work_dir is None else work_dir
    t0 = time.perf_counter()
    try:
        tables: dict[str, list[dict[str, Any]]] = {
            "rendezvous": [rendezvous_round(n) for n in sizes["nodes"]],
            "liveness": [liveness_poll(n) for n in sizes["nodes"]],
            "restore": [restore_agreement(n * RANKS_PER_NODE) for n in sizes["nodes"]],
            "exporter_ranks": [exporter_scrape(r, min(sizes["steps"]), work) for r in sizes["ranks"]],
            "exporter_steps": [exporter_scrape(min(sizes["ranks"]), s, work) for s in sizes["steps"]],
            "event_bytes": [event_bytes(r, work) for r in sizes["ranks"]],
        }
    finally:
        if own_dir:
            shutil.rmtree(work, ignore_errors=True)
    return {
        "size": size,
        "ranks_per_node": RANKS_PER_NODE,
        "target_nodes": TARGET_NODES,
        "tables": tables,
        "fits": fits(tables),
        "assumptions": ASSUMPTIONS,
        "seconds": time.perf_counter() - t0,
        "cpus": os.cpu_count(),
    }


ASSUMPTIONS = [
    "one process hosts the store and every client (threads, one TCP connection per simulated node, over "
    "loopback): network latency between pods (~0.1-0.5 ms in a VPC) is not in the figures; the store host's "
    "work and the serialization of requests are",
    "the rendezvous round counts its store work plus one 0.1 s poll of the host and one of every node "
    "(NVRx 0.7's sleeps); last_call_timeout (hot spares only) and waits for pods still being scheduled are "
    "outside it",
    "the liveness figures are one poll: launchers beat every 1 s, watchers and workers poll every "
    "LIVENESS_POLL_S (1 s), so the store host serves that many operations a second while a round starts",
    "the exporter's runs: 8 ranks per node, 10 s steps, a snapshot every 10 steps, a checkpoint every 100; "
    "the exporter runs on the pod of global rank 0 and stats every rank's file at each scrape",
    "projections extrapolate the log-log fit beyond the largest measured size",
]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.scale", description=__doc__.split("\n")[0])
    p.add_argument("--size", choices=sorted(SIZES), default="full")
    p.add_argument("--quick", action="store_true", help="same as --size quick")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    res = run("quick" if args.quick else args.size)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(res, indent=2) + "\n")
    for f in res["fits"]:
        k = "-" if f["exponent"] is None else f"{f['exponent']:.2f}"
        print(f"{f['series']:<48} k={k:>5}  at {f['at']:.0f}: {f['projected']} {f['unit']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
