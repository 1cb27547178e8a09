"""tools/podkill.py: kill specs refused in one line naming the field, each kind of a pod's processes
told apart in a real process tree shaped like a pod's, and the extra wall time a kill cost."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tools import podkill

# A pod's processes as /proc shows them, with sleeping stand-ins: the main process starts ft_launcher's
# process, the zygote (which forks a worker that leads its own session) and a cold worker (many threads)
# beside its one-thread stand-in, both children of ft_launcher; the worker's exporter child.
SLEEP = "import time; time.sleep(120)"
THREADED = "import threading, time; threading.Thread(target=time.sleep, args=(120,)).start(); time.sleep(120)"
ZYGOTE = (
    "import os, sys, time\n"
    "pid = os.fork()\n"
    "if pid == 0:\n"
    "    os.setsid(); time.sleep(120); os._exit(0)\n"
    "print(pid, flush=True); time.sleep(120)\n"
)
LAUNCHER = (
    "import json, subprocess, sys\n"
    "py = sys.executable\n"
    f"cold = subprocess.Popen([py, '-c', {THREADED!r}, '-m', 'trainer', '--steps=1'])\n"
    f"stand_in = subprocess.Popen([py, '-c', {SLEEP!r}, '-m', 'trainer', '--steps=1'])\n"
    f"exporter = subprocess.Popen([py, '-c', {SLEEP!r}, '-m', 'trainer.events.' + 'metrics_server'])\n"
    "print(json.dumps([cold.pid, stand_in.pid, exporter.pid]), flush=True)\n"
    "stand_in.wait()\n"
)
MAIN = (
    "import json, subprocess, sys\n"
    "py = sys.executable\n"
    "launcher = subprocess.Popen([py, '-c', sys.argv[1], 'trainer.launcher.ft'], stdout=subprocess.PIPE)\n"
    "zygote = subprocess.Popen([py, '-c', sys.argv[2], 'trainer.launcher.prefork.server'], "
    "stdout=subprocess.PIPE)\n"
    "cold, stand_in, exporter = json.loads(launcher.stdout.readline())\n"
    "forked = int(zygote.stdout.readline())\n"
    "print(json.dumps({'launcher': launcher.pid, 'zygote': zygote.pid, 'forked': forked, 'cold': cold, "
    "'stand_in': stand_in, 'exporter': exporter}), flush=True)\n"
    "launcher.wait()\n"
)


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ("shell:step=3", "process 'shell'"),
        ("zygote", "step=N is required"),
        ("zygote:step=x", "step must be a whole number"),
        ("zygote:step=3:step=4", "step given twice"),
        ("zygote:step=3:node=1", "'node=1' is not step=N or pod=I"),
        ("rendezvous:step=3:pod=0", "pod does not apply"),
        ("worker:step=3:pod=-1", "pod must be a whole number"),
    ],
)
def test_a_bad_kill_is_refused_in_one_line_naming_the_field(spec: str, field: str) -> None:
    with pytest.raises(ValueError) as info:
        podkill.parse(spec)
    assert field in str(info.value) and "\n" not in str(info.value)


def test_kills_parse_and_their_pods_are_job_indexes() -> None:
    assert podkill.parse("worker:step=7:pod=2") == podkill.Kill("worker", 7, 2)
    assert podkill.parse("rendezvous:step=3").spec == "rendezvous:step=3"
    with pytest.raises(ValueError, match="pod 3 is not a Job index"):
        podkill.parse_all(["main:step=1:pod=3"], pods=3)


def test_each_kind_of_a_pods_processes_is_told_apart() -> None:
    main = subprocess.Popen(
        [sys.executable, "-c", MAIN, LAUNCHER, ZYGOTE], stdout=subprocess.PIPE, start_new_session=True
    )
    try:
        assert main.stdout is not None
        pids = json.loads(main.stdout.readline())
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not (
            podkill._threads(pids["cold"]) >= 2  # the cold worker starting its second thread
            and os.getsid(pids["forked"]) == pids["forked"]  # the zygote's fork leading its own session
            # and every exec done: a process just past exec shows an empty command line for a moment
            and all(podkill._cmdline(pid) for pid in pids.values())
        ):
            time.sleep(0.05)
        procs = {main.pid, *pids.values()}
        assert podkill.find("main", main.pid, procs) == [main.pid]
        assert podkill.find("launcher", main.pid, procs) == [pids["launcher"]]
        assert podkill.find("zygote", main.pid, procs) == [pids["zygote"]], "not its forked worker"
        assert podkill.find("worker", main.pid, procs) == sorted([pids["forked"], pids["cold"]])
        assert podkill.find("exporter", main.pid, procs) == [pids["exporter"]]
    finally:
        os.killpg(main.pid, signal.SIGKILL)
        main.wait()
        for pid in pids.values():  # the forked worker leads its own session
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_extra_wall_time_is_the_span_over_the_kill_less_the_fault_free_span() -> None:
    clean = [(100.0 + s, s) for s in range(20)]  # one step a second
    # Killed at 105.5, after step 5: steps 5 and 6 again (a restore), then the rest, 3 s late.
    faulted = [(100.0 + s, s) for s in range(6)] + [(108.5 + i, s) for i, s in enumerate(range(5, 20))]
    # Step 5 + 4 = 9 is logged at 112.5 after the kill: 7.5 s, where the fault-free run took 4 s.
    assert podkill.extra_wall_s(faulted, clean, 105.5, window=4) == pytest.approx(3.5)
    assert podkill.extra_wall_s(faulted, clean, 105.5, window=40) is None, "never got there"
    assert podkill.bound_s(1.1) == pytest.approx(12.2)
