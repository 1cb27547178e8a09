"""tools/pod_roles.py: the pod that took a lost pod's place, read from NVRx 0.7 launcher log lines."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path

from tools.pod_roles import active_at, role_changes, takeover_after

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


def test_a_spare_that_never_joined_a_round_took_over_and_the_lost_pod_is_named(tmp_path: Path) -> None:
    """NVRx 0.7's own lines: a spare started while round 0 trains syncs to round 1 and logs only that it
    attempts to join; the replacement of the lost pod does the same and becomes the new spare."""
    attempt = "The node 'localhost_{}_0' attempts to join the next round of the rendezvous 'trainer'."
    joined = "The node 'localhost_{}_0' has joined the rendezvous 'trainer' as rank {} in a world of size 2."
    (tmp_path / "pod-0.log").write_text(
        _line("07:45:03,300", attempt.format(609))
        + _line("07:45:03,350", joined.format(609, 0))
        + _line("07:47:21,145", attempt.format(609))
        + _line("07:47:23,220", joined.format(609, 0))
    )
    (tmp_path / "pod-1.log").write_text(
        _line("07:45:03,366", "[localhost_791_0] Synced rendezvous round at initialization (0 -> 1)")
        + _line("07:45:03,501", attempt.format(791))
        + _line("07:47:22,245", joined.format(791, 1))
    )
    (tmp_path / "pod-2.log").write_text(
        _line("07:45:03,300", attempt.format(792))
        + _line("07:45:03,354", joined.format(792, 1))
        + _line("07:47:52,314", attempt.format(4330))  # the replacement pod, same index
    )
    loss = datetime(2026, 11, 30, 7, 47, 18, 880000).timestamp()
    changes = role_changes(tmp_path)
    took = takeover_after(changes, loss)
    assert took is not None
    assert (took.spare, took.rank, took.new_spares) == ("pod-1", 1, ("pod-2",))
    assert abs(took.joined_after_s - 3.365) < 1e-3
    assert active_at(changes, loss, 1) == "pod-2"
    assert active_at(changes, loss, 0) == "pod-0"


def test_no_takeover_when_the_survivors_waited_for_the_replacement(tmp_path: Path) -> None:
    attempt = "The node 'n{}' attempts to join the next round of the rendezvous 'trainer'."
    joined = "The node 'n{}' has joined the rendezvous 'trainer' as rank {} in a world of size 2."
    (tmp_path / "pod-0.log").write_text(
        _line("05:00:00,000", joined.format(0, 0)) + _line("05:00:40,000", joined.format(0, 0))
    )
    # pod 1 lost at 05:00:20; its replacement (same log) joins as node 1 again: not a spare taking over
    (tmp_path / "pod-1.log").write_text(
        _line("05:00:00,000", joined.format(1, 1))
        + _line("05:00:38,000", attempt.format(2))
        + _line("05:00:40,000", joined.format(2, 1))
    )
    assert takeover_after(role_changes(tmp_path), datetime(2026, 11, 30, 5, 0, 20).timestamp()) is None


def test_a_replacement_that_stands_by_silently_is_a_spare_from_its_launchers_start(tmp_path: Path) -> None:
    # NVRx 0.7 logs nothing for a standby until the next round opens: the replacement of pod 1 (lost at
    # 05:00:20) started at 05:00:30 and is a spare from then on, so after pod 2 is lost at 05:00:50 it
    # is the spare that took over, not "pod 1 again".
    joined = "The node 'n{}' has joined the rendezvous 'trainer' as rank {} in a world of size 2."
    started = "[INFO] [vm] [workload:?(?) infra:?(?)] launcher.py:2754 Using nproc_per_node=1."
    (tmp_path / "pod-0.log").write_text(_line("05:00:00,000", joined.format(0, 0)))
    (tmp_path / "pod-1.log").write_text(
        _line("05:00:00,000", joined.format(1, 1))
        + f"2026-11-30 05:00:30,000 {started}\n"
        + _line("05:00:52,000", joined.format(3, 1))
    )
    (tmp_path / "pod-2.log").write_text(_line("05:00:22,000", joined.format(2, 1)))
    changes = role_changes(tmp_path)
    took = takeover_after(changes, datetime(2026, 11, 30, 5, 0, 50).timestamp())
    assert took is not None and (took.spare, took.rank) == ("pod-1", 1)
    # Without the start line the replacement kept its lost predecessor's role, and nothing took over.
    (tmp_path / "pod-1.log").write_text(
        _line("05:00:00,000", joined.format(1, 1)) + _line("05:00:52,000", joined.format(3, 1))
    )
    assert takeover_after(role_changes(tmp_path), datetime(2026, 11, 30, 5, 0, 50).timestamp()) is None
