"""ft_launcher's rank monitor (`nvidia_resiliency_ext.fault_tolerance.rank_monitor_client`): setting the
calculated heartbeat timeouts (hangtimeout.py) through its state protocol, since it has no setter.
Upstream report: docs/nvrx-rank-monitor-timeouts.md; canary: tests/trainer/resilience/test_hang_timeout.py
(`test_the_rank_monitor_client_still_has_no_public_timeout_setter`).

RankMonitorClient has no public setter for one heartbeat timeout: calculate_and_set_hb_timeouts()
computes its own value (no floor, a collective inside). Its state protocol is public and does what is
needed: load_state_dict() after init_workload_monitoring() sends the HeartbeatTimeouts it carries to
the rank monitor at once (an UpdateConfigMsg, acknowledged), which sets both of the monitor's heartbeat
timeouts; state_dict() returns the same layout. Checked in NVRx 0.7.0 (rank_monitor_client.py).
"""

from __future__ import annotations

from typing import Any

#: RankMonitorClient.CURRENT_TIMEOUTS_STATE_KEY (a test checks it against the installed NVRx).
TIMEOUTS_STATE_KEY = "current_timeouts"


def heartbeat_state(initial_s: float | None, subsequent_s: float, calculated: bool) -> dict[str, Any]:
    """A RankMonitorClient state dict carrying these heartbeat timeouts (HeartbeatTimeouts fields)."""
    hb = {"initial": initial_s, "subsequent": subsequent_s, "were_calculated": calculated}
    return {TIMEOUTS_STATE_KEY: {"heartbeat": hb}}


def heartbeat_timeout_from_state(state: Any) -> float | None:
    """The calculated subsequent-heartbeat timeout in a RankMonitorClient state dict, if it has one."""
    try:
        hb = state[TIMEOUTS_STATE_KEY]["heartbeat"]
        return float(hb["subsequent"]) if hb.get("were_calculated") else None
    except (KeyError, TypeError, ValueError):
        return None


def set_heartbeat_timeouts(
    client: Any, initial_s: float | None, subsequent_s: float, calculated: bool
) -> None:
    """Make the rank monitor of a connected client use these heartbeat timeouts from now on."""
    client.load_state_dict(heartbeat_state(initial_s, subsequent_s, calculated))


def initial_heartbeat_timeout(client: Any) -> float | None:
    """The rank monitor's initial heartbeat timeout as a connected client received it (None: off)."""
    return getattr(getattr(client, "cfg", None), "initial_rank_heartbeat_timeout", None)
