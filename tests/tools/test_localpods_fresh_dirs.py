"""A replacement pod starts with empty emptyDir volumes (its /dev/shm): the lost pod's snapshots are gone."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from tools.localpods import LocalJob, PodSpec

# Attempt 0 leaves a file in its shm and waits to be killed; attempt 1 exits 0 only if shm is empty.
POD = """
import os, sys, time
shm, marker = sys.argv[1], sys.argv[2]
if not os.path.exists(marker):
    open(os.path.join(shm, "rank0.slot0"), "w").write("snapshot")
    open(marker, "w").write("started")
    time.sleep(600)
sys.exit(0 if os.listdir(shm) == [] else 7)
"""


def test_a_replaced_pod_gets_an_empty_shm(tmp_path: Path) -> None:
    shm, marker = tmp_path / "shm-pod0", tmp_path / "attempt0"
    (shm / "stale").mkdir(parents=True)  # left over from before the job: also gone
    spec = PodSpec(
        "pod-0", [sys.executable, "-c", POD, str(shm), str(marker)], dict(os.environ), tmp_path / "pod.log",
        fresh_dirs=(shm,),
    )  # fmt: skip
    with LocalJob([spec], backoff_limit=0) as job:
        job.start()
        deadline = time.monotonic() + 60
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (shm / "rank0.slot0").exists() and not (shm / "stale").exists()
        job.kill_pod(0)
        result = job.wait(timeout_s=60)
    assert result.succeeded, (result.reason, (tmp_path / "pod.log").read_text()[-2000:])
    assert [e.reason for e in result.exits] == ["disrupted", "succeeded"]
