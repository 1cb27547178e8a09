"""The orphan check of tests/orphans.py finds a detached survivor of the session and nothing else."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from tests.orphans import SESSION_ENV, orphans


def test_a_detached_survivor_is_found_and_a_child_is_not(tmp_path: Path) -> None:
    session = os.environ[SESSION_ENV]  # set for the whole session by the plugin
    pid_file = tmp_path / "pid"
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    daemonize = (
        "import os, time\n"
        "if os.fork() == 0:\n"
        f"    open({str(pid_file)!r}, 'w').write(str(os.getpid())); time.sleep(60)\n"
    )
    subprocess.run([sys.executable, "-c", daemonize], check=True)  # its parent exits: an orphan
    try:
        deadline = time.monotonic() + 10
        while not pid_file.is_file() and time.monotonic() < deadline:
            time.sleep(0.05)
        orphan = int(pid_file.read_text())
        found = orphans(os.getpid(), session)
        assert orphan in found
        assert child.pid not in found  # still the runner's child: a fixture's server, say
        assert orphans(os.getpid(), "another-session") == []
    finally:
        child.kill()
        child.wait()
        os.kill(int(pid_file.read_text()), 9)
