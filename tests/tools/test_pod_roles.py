"""tools/pod_roles.py: the pod that took a lost pod's place, read from NVRx 0.7 launcher log lines."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from tools.pod_roles import role_changes, takeover_after

PREFIX = "[INFO] [vm] [workload:?(?) infra:?(?)] ft_rendezvous_barrier.py:2804"


def _line(stamp: str, text: str) -> str:
    return f"2026-11-30 {stamp} {PREFIX} {text}\n"


def test_the_standby_that_joins_after_the_loss_took_over(tmp_path: Path) -> None:
    joined = "The node 'localhost_{}_0' has joined the rendezvous 'trainer' as rank {} in a world of size 2."
    (tmp_path / "pod-0.log").write_text(
        _line("05:00:00,000", joined.format(1, 0)) + _line("05:00:30,000", joined.format(1, 0))
    )
    (tmp_path / "pod-1.log").write_text(  # lost at 05:00:20; its replacement arrives late, stands by
        _line("05:00:00,000", joined.format(2, 1))
        + _line("05:00:45,000", "[localhost_4_0] Standby (rank=2) for round 1; waiting for round 2 to open")
    )
    (tmp_path / "pod-2.log").write_text(
        _line(
            "05:00:01,000",
            "[localhost_3_0] [Step 0] Round 0 closed (training in progress), waiting for next round...",
        )
        + _line("05:00:30,500", joined.format(3, 1))
    )
    loss = datetime(2026, 11, 30, 5, 0, 20).timestamp()
    took = takeover_after(role_changes(tmp_path), loss)
    assert took is not None
    assert (took.spare, took.rank, took.new_spares) == ("pod-2", 1, ("pod-1",))
    assert abs(took.joined_after_s - 10.5) < 1e-6


def test_no_takeover_without_a_standby(tmp_path: Path) -> None:
    (tmp_path / "pod-0.log").write_text(
        _line("05:00:00,000", "The node 'n' has joined the rendezvous 'x' as rank 0 in a world of size 1.")
    )
    assert takeover_after(role_changes(tmp_path), datetime(2026, 11, 30, 5, 0, 1).timestamp()) is None
