"""Plans shared by the goodput tests (a helper module, not a test module)."""

from __future__ import annotations

from typing import Any

from goodput import PROFILES, Plan, Tier

LLAMA3 = PROFILES["llama3-405b"][0]
TIERS = (
    Tier("in-process", 0.3, 30.0, "memory"),
    Tier("in-job", 0.5, 120.0, "checkpoint"),
    Tier("job-restart", 0.2, 900.0, "checkpoint"),
)

# Memory and peer tiers that recompute 12 s per fault; the peer tier's fallback restores the checkpoint.
PEER_TIERS = (
    Tier("in-process", 0.2, 30.0, "memory", 12.0),
    Tier("node-loss", 0.7, 180.0, "peer", 12.0, 400.0),
    Tier("job-restart", 0.1, 900.0, "checkpoint"),
)


def make_plan(**kw: Any) -> Plan:
    """The Llama 3 405B scale plan (2048 x 8 GPUs, stall 10 s, interval 600 s) with ``kw`` replaced."""
    base = {
        "nodes": 2048,
        "gpus_per_node": 8,
        "rate_per_gpu_hour": LLAMA3,
        "tiers": TIERS,
        "stall_s": 10.0,
        "interval_s": 600.0,
    }
    base.update(kw)
    return Plan(**base)
