"""A hang is caught after the timeout calculated from the measured step time, long before the static
heartbeat timeout: the real pod command (ft_launcher + trainer, 2 ranks, tier 1 off) with the suite's
static timeout (70 s), steps of 0.1-1.5 s and an 8 s floor (well above a healthy step on a loaded
machine); both ranks stop making progress in Python, so nothing but the launcher heartbeat can notice.
Persistence across a worker restart: tests/trainer/resilience/test_hang_timeout.py."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from tests.helpers import free_port
from tests.trainer._jobs import RUN_VALUES, log_tail, of, read_events, run_job
from tools.podcommand import LocalPlaces, pod_argv

STATIC_S = RUN_VALUES["ftRankHeartbeatTimeout"]  # what a hang would cost without the calculation
FLOOR_S = 8
HANG_STEP = 7  # after the warm-up (4 intervals, saves after steps 2 and 5 among them)


def _log_time(line: str) -> float:
    """Epoch seconds of a log line's `YYYY-MM-DD HH:MM:SS,mmm` prefix (local time, as logging writes it)."""
    stamp, millis = line[:23].split(",")
    return time.mktime(time.strptime(stamp, "%Y-%m-%d %H:%M:%S")) + int(millis) / 1000


@pytest.mark.slow
def test_hang_is_caught_after_the_calculated_timeout(
    tmp_path: Path, token_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    values = {
        **RUN_VALUES,
        "inprocess": False,
        "hangTimeoutFloor": FLOOR_S,
        "hangTimeoutFactor": 3,
        "hangWarmupSteps": 4,  # = ckptInterval + 1: the save after step 2 is measured
        "inprocessLivenessTimeout": 1.5,  # below the floor, as the chart requires
        "ftWorkloadCheckInterval": 0.5,
        # No restart: detection is the point (recovery from a hang: test_tier2.py); one start-up less.
        "maxRestarts": 0,
        "faults": {"a": f"hang:step={HANG_STEP}:rank=0", "b": f"hang:step={HANG_STEP}:rank=1"},
    }
    out = tmp_path / "run"
    log = tmp_path / "job.log"
    monkeypatch.setenv("TRAINER_LOG_LEVEL", "INFO")  # the heartbeat logs the value it adopts
    rc = run_job(pod_argv(values, LocalPlaces(free_port(), token_file, out)), log, timeout_s=150)
    text = log.read_text(errors="replace")
    assert rc != 0, log_tail(log)  # the hung workers were stopped and no restart was left

    # Each rank calculated and persisted its timeout (NVRx's RankMonitorClient state layout).
    calculated = {}
    for rank in (0, 1):
        state = json.loads((out / "hang-timeouts" / f"rank{rank}.json").read_text())
        hb = state["current_timeouts"]["heartbeat"]
        assert hb["were_calculated"] and FLOOR_S <= hb["subsequent"] < STATIC_S / 2, hb
        calculated[rank] = hb["subsequent"]
    assert re.search(r"heartbeat: hang timeout [0-9.]+ s \(3 x longest step", text), log_tail(log)

    # ft_launcher's rank monitors fired with the calculated timeout, not the static 60 s ...
    fired = re.findall(r"^(.*)Did not get subsequent heartbeat\. Waited ([0-9.]+) seconds", text, re.M)
    # At least one rank monitor fires; the first to fire makes the launcher stop every worker, so the
    # other rank's monitor (its timeout a few ms longer) may never get to log.
    assert fired, log_tail(log)
    waited = [float(w) for _, w in fired]
    assert all(any(abs(w - c) < 0.01 for c in calculated.values()) for w in waited), (waited, calculated)
    # ... a few seconds after the hang began (the timeout plus at most one check interval, and load).
    evs = read_events(out)
    t_hang = min(float(e["t"]) for e in of(evs, "fault_injected"))
    assert {int(e["step"]) for e in of(evs, "fault_injected")} == {HANG_STEP}
    detected_after = max(_log_time(line) for line, _ in fired) - t_hang
    assert 0 < detected_after < STATIC_S / 2, f"detected {detected_after:.1f} s after the hang"
