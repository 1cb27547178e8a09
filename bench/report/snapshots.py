"""The in-memory snapshot section: blocked time per snapshot and per durable save next to the one-copy
floor, extra host memory per rank, steps recomputed per fault and restore time per source (from
bench.snapshot's ``snapshot.json``; the durable save's figures from ``ckpt_stall.json``)."""

from __future__ import annotations

import statistics
from typing import Any

from bench.report.fmt import fmt_spread, md_table

TARGET_X_FLOOR = 1.5  # target: a snapshot or save blocks the loop at most 1.5x one copy
TARGET_RESTORE_X_FLOOR = 2.0  # target: a restore from memory takes at most 2x one copy
SOURCES = ("memory", "shm", "peer", "local", "fsx")
WHERE = {
    "memory": "the process's own memory (tier 1)",
    "shm": "the pod's /dev/shm (worker restart)",
    "peer": "a peer node's replica",
    "local": "the node-local NVMe checkpoint",
    "fsx": "the durable checkpoint (local disk here)",
}


def _ms(s: dict[str, Any] | None) -> str:
    if not s:
        return "-"
    scaled = {k: 1e3 * float(s[k]) for k in ("median", "min", "max")}
    return fmt_spread(scaled | {"n": s.get("n", 1)}, "ms", 1)


def _durable(stall: dict[str, Any] | None, mib: int) -> tuple[str, str]:
    """The default durable save's blocked time (nvrx written from the step's snapshot, where measured;
    else nvrx's direct path) and its multiple of the floor at ``mib``."""
    at = [r for r in (stall or {}).get("rows") or [] if r.get("MiB/rank") == mib]
    rows = [r for r in at if r.get("mode") == "nvrx-from-snapshot"]
    rows = rows or [r for r in at if r.get("mode") == "nvrx"]
    if not rows:
        return "-", "-"
    return _ms(rows[0].get("blocked_s")), f"{float(rows[0]['x floor']):.2f}"


def _size_rows(snap: dict[str, Any], stall: dict[str, Any] | None) -> list[list[str]]:
    out = []
    for r in snap.get("rows") or []:
        rs = r.get("restore_s") or {}
        durable, durable_x = _durable(stall, int(r["mib"]))
        ratio = float(r["blocked_over_floor"])
        ratios = r.get("restore_over_floor") or {}
        out.append(
            [
                str(r["mib"]),
                _ms(r["floor_s"]),
                _ms(r["blocked_s"]),
                f"{ratio:.2f}" + ("" if ratio <= TARGET_X_FLOOR else " (over 1.5)"),
                _ms(r.get("commit_s")),
                durable,
                durable_x,
                f"{r['host_bytes'] / 2**20:.0f} MiB",
                _restore_cell(rs.get("memory"), ratios.get("memory"), TARGET_RESTORE_X_FLOOR),
                _restore_cell(rs.get("shm"), ratios.get("shm"), None),
                fmt_spread(rs.get("fsx"), "s", 3),
            ]
        )
    return out


def _restore_cell(spread: dict[str, Any] | None, ratio: float | None, target: float | None) -> str:
    """A restore's time, and its multiple of the floor copy beside it where the run measured one."""
    cell = fmt_spread(spread, "s", 3)
    if ratio is None:
        return cell
    over = target is not None and float(ratio) > target
    return f"{cell}, x{float(ratio):.2f}" + (f" (over {target:g})" if over else "")


def _fault_rows(faults: list[dict[str, Any]]) -> list[list[str]]:
    out = []
    for name in dict.fromkeys(f["scenario"] for f in faults):
        runs = [f for f in faults if f["scenario"] == name]
        good = [f for f in runs if f.get("ok") and f.get("steps_recomputed") is not None]
        steps = [float(f["steps_recomputed"]) for f in good]
        mttr = [float(f["mttr_s"]) for f in good if f.get("mttr_s") is not None]
        sources = sorted({str(f.get("restored_from")) for f in good})
        spread = (
            {"median": statistics.median(steps), "min": min(steps), "max": max(steps), "n": len(steps)}
            if steps
            else None
        )
        out.append(
            [
                f"`{name}`",
                f"{len(good)}/{len(runs)}",
                ", ".join(sources) or "-",
                fmt_spread(spread, "", 0),
                fmt_spread(
                    {"median": statistics.median(mttr), "min": min(mttr), "max": max(mttr), "n": len(mttr)}
                    if mttr
                    else None,
                    "s",
                ),
            ]
        )
    return out


def snapshots_section(snap: dict[str, Any], stall: dict[str, Any] | None = None) -> str:
    """Markdown for bench.snapshot's result (and the durable save's blocked time beside it)."""
    cfg = snap.get("config") or {}
    text = [
        "### In-memory snapshots",
        f"`python -m bench.snapshot` ({snap.get('note', '')}; {cfg.get('reps', '?')} snapshots per size, "
        "median (min-max)). *floor*: one copy of the same tensors into preallocated host buffers; "
        "*snapshot blocked*: what the training loop waits for (the copy; the XXH3-128 checksum and header "
        "follow in "
        "a background thread, *commit*); *x floor*: the median of each snapshot's ratio to the floor copy "
        "just before it (on this shared machine it swings between runs and sizes: read it as noise "
        "around the target, not as a measurement of it); *durable save*: the chart's default `nvrx` "
        "checkpoint save of the same size per rank, written from the step's snapshot (bench.ckpt_stall's "
        "`nvrx-from-snapshot`, 2 ranks: the snapshot and the save's hold of its slot); *host memory*: "
        "the two slots a rank keeps (double buffering), the extra host memory per rank; *restore*: verify, "
        "load and apply, from "
        + ", ".join(f"{s} = {WHERE[s]}" for s in ("memory", "shm", "fsx"))
        + " (memory: the slot this process committed is its own memory, its payload is not checksummed "
        "again; shm: the load checksums it before copying), with xN its median ratio to a floor copy "
        f"beside each restore. Targets: blocked <= {TARGET_X_FLOOR}x the floor, restore from memory <= "
        f"{TARGET_RESTORE_X_FLOOR:g}x. The durable save's columns come from "
        "bench.ckpt_stall's own run, at another time and load: compare each blocked time with the floor "
        "measured beside it, not the two runs' milliseconds with each other.",
        "",
        md_table(
            [
                "MiB/rank",
                "floor",
                "snapshot blocked",
                "x floor",
                "commit (background)",
                "durable save blocked",
                "x floor",
                "host memory",
                "restore memory",
                "restore shm",
                "restore fsx",
            ],
            _size_rows(snap, stall),
        ),
        "",
    ]
    faults = snap.get("faults") or []
    if faults:
        text += [
            "Steps recomputed per fault with a snapshot after every step (bench.recovery's runs, "
            "`snapshotInterval: 1`; 2 CPU ranks, fault at step 8 of 14; `node-loss/peer`: "
            "bench.recovery_pods' 2 pods x 1 rank and a hot spare, snapshots replicated to the other pod, "
            "pod 1 lost at step 6 of 14, its MTTR includes the spare's rendezvous). *steps recomputed*: "
            "completed steps done again after the restore (the step in flight when the fault hit is lost "
            "as well, and is not counted); *restored from*: the restore event's source (a node loss: the "
            "lost node's ranks'; the survivor restores from its own /dev/shm). The planner reads these "
            "(`python -m goodput --rollback-from bench/results/snapshot.json`).",
            "",
            md_table(["scenario", "ok", "restored from", "steps recomputed", "MTTR"], _fault_rows(faults)),
            "",
        ]
    else:
        text += ["(Steps recomputed per fault: not measured in this run; `--faults N` measures them.)", ""]
    return "\n".join(text)
