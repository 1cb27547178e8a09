"""From tier specs and measured rollbacks to a plan: each memory or peer tier's rollback, the snapshot
overhead, the replica-loss window and the best snapshot interval.

A memory or peer tier loses, per fault, the steps recomputed after its restore (measured: bench.snapshot
``--faults``, a run's summary.json; or ``steps=`` in its spec) plus the snapshot's lag: on average
``k / 2`` steps with a snapshot every ``k`` steps (the step in flight, half done, and ``(k - 1) / 2``
completed steps since the snapshot). Snapshots block the loop ``blocked_s`` each, every ``k`` steps.
The best ``k`` trades the two; it is found by evaluating the model at each ``k`` (``1 .. MAX_EVERY``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from goodput.model import ROLLBACKS, Plan, PlanError, Tier, evaluate, optimal_interval

MAX_EVERY = 256
SPEC_KEYS = ("share", "mttr", "rollback", "steps", "source", "fallback-mttr")


@dataclass(frozen=True)
class TierSpec:
    """A tier as the user gives it: the model's tier less its rollback seconds, plus where its measured
    rollback comes from (``source``: the restore event's source) or a given ``steps``."""

    name: str
    share: float
    mttr_s: float
    rollback: str = "checkpoint"
    source: str | None = None
    steps: float | None = None
    fallback_mttr_s: float | None = None

    def tier(self, rollback_s: float = 0.0) -> Tier:
        return Tier(self.name, self.share, self.mttr_s, self.rollback, rollback_s, self.fallback_mttr_s)  # type: ignore[arg-type]


def _number(spec: str, key: str, text: str) -> float:
    try:
        if "/" in text:  # a share as a count over a total, e.g. 63/419
            num, den = text.split("/", 1)
            return float(num) / float(den)
        return float(text)
    except (ValueError, ZeroDivisionError) as err:
        raise PlanError(f"--tier {spec!r}: {key} must be a number, got {text!r}") from err


def parse_tier_spec(spec: str) -> TierSpec:
    """Parse ``NAME:share=S:mttr=SEC[:rollback=R][:steps=N][:source=SRC][:fallback-mttr=SEC]``."""
    name, *parts = spec.split(":")
    fields: dict[str, str] = {}
    for part in parts:
        key, sep, value = part.partition("=")
        if not sep or key not in SPEC_KEYS:
            raise PlanError(
                f"--tier {spec!r}: expected NAME:share=S:mttr=SECONDS[:key=value...], got {part!r}"
            )
        fields[key] = value
    for key in ("share", "mttr"):
        if key not in fields:
            raise PlanError(f"--tier {spec!r}: missing {key}=")
    rollback = fields.get("rollback", "checkpoint")
    if rollback not in ROLLBACKS:
        raise PlanError(f"--tier {spec!r}: rollback must be one of {ROLLBACKS}, got {rollback!r}")
    if rollback == "checkpoint" and ("steps" in fields or "source" in fields):
        raise PlanError(f"--tier {spec!r}: steps= and source= apply to memory and peer tiers only")
    out = TierSpec(
        name,
        _number(spec, "share", fields["share"]),
        _number(spec, "mttr", fields["mttr"]),
        rollback,
        fields.get("source") or ({"memory": "memory", "peer": "peer"}.get(rollback)),
        _number(spec, "steps", fields["steps"]) if "steps" in fields else None,
        _number(spec, "fallback-mttr", fields["fallback-mttr"]) if "fallback-mttr" in fields else None,
    )
    out.tier()  # validates the fields the model checks, naming the tier
    return out


@dataclass(frozen=True)
class SnapshotInputs:
    step_s: float
    """Seconds per training step."""
    blocked_s: float
    """Seconds one snapshot blocks the loop."""
    every: int | None = None
    """Snapshot every this many steps; None: the best for the plan."""
    rereplication_s: float | None = None
    """Replica-loss window; None: the peer tier's MTTR plus one snapshot interval (until the replaced
    node's state is replicated again)."""

    def __post_init__(self) -> None:
        if not self.step_s > 0 or math.isinf(self.step_s):
            raise PlanError(f"--step-time must be a finite number > 0, got {self.step_s}")
        if not self.blocked_s >= 0 or math.isinf(self.blocked_s):
            raise PlanError(f"--snapshot-blocked must be a finite number >= 0, got {self.blocked_s}")
        if self.every is not None and self.every < 1:
            raise PlanError(f"--snapshot-every must be >= 1, got {self.every}")


def rollback_steps(
    specs: tuple[TierSpec, ...], measured: dict[str, dict[str, float]], default: float
) -> dict[str, dict[str, Any]]:
    """Steps recomputed per fault (before the snapshot lag) of each memory or peer tier, and where the
    figure comes from: ``steps=`` in its spec, the median measured for its source, else ``default``."""
    out: dict[str, dict[str, Any]] = {}
    for s in specs:
        if s.rollback == "checkpoint":
            continue
        if s.steps is not None:
            out[s.name] = {"steps": s.steps, "from": "given"}
        elif s.source in measured:
            m = measured[s.source]
            out[s.name] = {
                "steps": float(m["median"]),
                "from": f"measured ({s.source} restores)",
                "measured": m,
            }
        else:
            out[s.name] = {"steps": default, "from": f"assumed, no {s.source} restore measured"}
    return out


def plan_for(
    base: Plan,
    specs: tuple[TierSpec, ...],
    steps: dict[str, dict[str, Any]],
    snap: SnapshotInputs,
    every: int,
) -> Plan:
    """``base`` with the tiers of ``specs``, a snapshot every ``every`` steps."""
    lag = every / 2.0
    tiers = tuple(
        s.tier(0.0 if s.rollback == "checkpoint" else (steps[s.name]["steps"] + lag) * snap.step_s)
        for s in specs
    )
    uses_snapshots = any(s.rollback != "checkpoint" for s in specs)
    peer = next((s for s in specs if s.rollback == "peer"), None)
    window = snap.rereplication_s
    if window is None:
        window = (peer.mttr_s + every * snap.step_s) if peer is not None else 0.0
    return base.with_(
        tiers=tiers,
        snapshot_overhead=snap.blocked_s / (every * snap.step_s) if uses_snapshots else 0.0,
        rereplication_s=window,
    )


def best_plan(
    base: Plan, specs: tuple[TierSpec, ...], steps: dict[str, dict[str, Any]], snap: SnapshotInputs
) -> tuple[Plan, int | None]:
    """The plan at the given snapshot interval, or at the one (1 .. MAX_EVERY) with the highest
    efficiency at its optimal checkpoint interval. None: no tier uses snapshots."""
    if not any(s.rollback != "checkpoint" for s in specs):
        return plan_for(base, specs, steps, snap, 1), None
    candidates = [snap.every] if snap.every is not None else range(1, MAX_EVERY + 1)
    best: tuple[float, Plan, int] | None = None
    for k in candidates:
        p = plan_for(base, specs, steps, snap, k)
        opt = optimal_interval(p)
        tau = opt if math.isfinite(opt) and opt > 0 else base.interval_s
        eff = evaluate(p, tau).efficiency
        if best is None or eff > best[0]:
            best = (eff, p, k)
    assert best is not None
    return best[1], best[2]
