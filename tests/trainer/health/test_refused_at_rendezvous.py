"""A node whose storage check fails is refused at the rendezvous and the hot spare trains in its place:
the pod command as the chart renders it (nodeHealth on), 2 nodes + 1 spare on 127.0.0.1, each pod with
its own health daemon (the chart's node-health sidecar, started before the pod as the kubelet starts it),
pod 1's pointed at a storage path it cannot write. Pod 1's ft_launcher asks its daemon before it joins
the first round (NVRx's pre-join health check), is refused and exits non-zero; the spare, pod 2, joins in
its place and pods 0 and 2 train to the end."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT, free_port
from tests.trainer.resilience._pods import logs, pod_values
from tools.localjob import LocalJob
from tools.localpods import node_places, node_pod_spec
from tools.podcommand import LocalPlaces, pod_argv

pytestmark = pytest.mark.slow

STEPS = 4
ENDPOINT = "--ft-node-health-check-endpoint="


def start_daemon(sock: Path, storage: Path, log: Path) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "trainer.health", f"--socket={sock}", f"--storage-path={storage}"]
    return subprocess.Popen(argv, stderr=log.open("wb"), cwd=REPO_ROOT)


def wait_serving(proc: subprocess.Popen[bytes], sock: Path, log: Path) -> None:
    """What the sidecar's startup probe waits for: something accepts on the socket."""
    deadline = time.monotonic() + 60
    while True:
        with socket.socket(socket.AF_UNIX) as probe:
            if probe.connect_ex(str(sock)) == 0:
                return
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.1)


@pytest.fixture
def sockets() -> Iterator[Path]:
    folder = Path(tempfile.mkdtemp(prefix="hc-", dir="/tmp"))  # a socket path holds 107 bytes
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_a_node_failing_its_storage_check_is_refused_and_the_spare_trains(
    tmp_path: Path, token_file: Path, sockets: Path
) -> None:
    port, out = free_port(), tmp_path / "run"
    (tmp_path / "not-a-dir").write_text("")
    storage = {0: out, 1: tmp_path / "not-a-dir" / "run", 2: out}
    values = pod_values(2, 1, spareNodes=1, steps=STEPS, ckptInterval=2, nodeHealth=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO_ROOT)}
    daemons, specs = [], []
    try:
        for i in range(3):
            daemons.append(start_daemon(sockets / f"pod{i}.sock", storage[i], tmp_path / f"health-{i}.log"))
        for i, proc in enumerate(daemons):
            wait_serving(proc, sockets / f"pod{i}.sock", tmp_path / f"health-{i}.log")
        for i in range(3):
            sock = sockets / f"pod{i}.sock"
            places = node_places(LocalPlaces(port, token_file, out), i)
            argv = pod_argv(values, places)
            assert any(a.startswith(ENDPOINT) for a in argv), "the chart passes no health endpoint"
            argv = [f"{ENDPOINT}{sock}" if a.startswith(ENDPOINT) else a for a in argv]
            if i == 2:
                # The spare's launcher starts once pod 1's daemon has answered: pod 1 then surely meets
                # the first round open (a launcher that finds it closed stands by unchecked until the
                # next round opens, and would be the spare itself).
                wait = 'until grep -q fail_count "$0"; do sleep 0.1; done; exec "$@"'
                argv = ["sh", "-c", wait, str(tmp_path / "health-1.log"), *argv]
            pod_env = {**env, "GROUP_RANK": str(i)}
            specs.append(node_pod_spec(f"pod-{i}", argv, pod_env, tmp_path / f"pod-{i}.log", places))
        # The refused pod's replacement is not started within the test (a real one lands on a node that
        # passes its checks, or is refused again): the run ends with the two healthy pods.
        with LocalJob(specs, host_port=port, backoff_limit=1, replace_delay_s=3600) as job:
            job.start()
            deadline = time.monotonic() + 240
            while {e.index for e in job.exits} != {0, 1, 2}:
                job.poll()
                assert time.monotonic() < deadline, logs(tmp_path)
                time.sleep(0.2)
            exits = {e.index: e for e in job.exits}
    finally:
        for proc in daemons:
            proc.terminate()
            proc.wait(10)
    assert exits[1].returncode != 0 and exits[1].reason == "failed", exits
    assert (exits[0].returncode, exits[2].returncode) == (0, 0), logs(tmp_path)
    pod1 = (tmp_path / "pod-1.log").read_text(errors="replace")
    # NVRx's log line of the refusal, with the daemon's reply: success false, the storage check named.
    refusal = r'Node health check failed \(exit_code=1\)\. Output: .*"failed_checks": \["storage: '
    assert re.search(refusal, pod1), pod1[-4000:]
    assert "UnhealthyNodeException" in pod1 and "Assigned active rank" not in pod1
    # The spare (pod 2) took the refused node's place in the first round, beside pod 0.
    for i in (0, 2):
        assert "Assigned active rank" in (tmp_path / f"pod-{i}.log").read_text(errors="replace"), i
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["final_step"] == STEPS - 1, logs(tmp_path)
    # Each daemon was asked by its own launcher: the healthy ones answered fail_count 0.
    for i in (0, 2):
        assert '"fail_count": 0' in (tmp_path / f"health-{i}.log").read_text()
