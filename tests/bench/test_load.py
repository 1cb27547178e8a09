"""bench/load.py: CPU taken by the benchmark's own process tree is told apart from other work."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from bench import __main__ as bench_main
from bench.load import QUIET_FOREIGN_CORES, TreeCpu, summarize, tree_cpu_s

BURN = "import time\nt = time.process_time()\nwhile time.process_time() - t < {s}: pass\n"


def test_a_childs_cpu_counts_as_the_benchmarks_own() -> None:
    before = tree_cpu_s(os.getpid())
    subprocess.run([sys.executable, "-c", BURN.format(s=0.6)], check=True)  # reaped: in our cutime
    child = subprocess.Popen([sys.executable, "-c", BURN.format(s=0.6) + "time.sleep(30)\n"])
    try:
        deadline = time.monotonic() + 20
        while tree_cpu_s(os.getpid()) - before < 1.1 and time.monotonic() < deadline:
            time.sleep(0.1)  # the live child's time is read from its own stat while it runs
        assert tree_cpu_s(os.getpid()) - before >= 1.1
    finally:
        child.kill()
        child.wait()


def test_a_process_outside_the_tree_is_not_counted_as_own(tmp_path: Path) -> None:
    """A process reparented to init (as a leaked checkpoint worker is) competes as foreign work."""
    pid_file = tmp_path / "pid"
    script = (
        "import os, sys\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        # Written beside and renamed: the test reads the pid only once it is whole (an open() for
        # writing creates the file empty, and the test once read it in that moment).
        f"    open({str(pid_file)!r} + '.part', 'w').write(str(os.getpid()))\n"
        f"    os.replace({str(pid_file)!r} + '.part', {str(pid_file)!r})\n"
        + "\n".join("    " + line for line in BURN.format(s=1.0).splitlines())
        + "\n    os._exit(0)\n"
    )
    before = tree_cpu_s(os.getpid())
    subprocess.run([sys.executable, "-c", script], check=True)  # the parent exits; the child is orphaned
    deadline = time.monotonic() + 20
    while not pid_file.is_file() and time.monotonic() < deadline:
        time.sleep(0.05)
    orphan = int(pid_file.read_text())
    while Path(f"/proc/{orphan}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    # The short-lived parent's own start-up is ours; the orphan's second of CPU is not.
    assert tree_cpu_s(os.getpid()) - before < 0.9


def _wait_for(path: Path, deadline: float) -> None:
    while not path.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert path.exists(), f"{path.name} never appeared"


def test_an_orphaned_descendant_keeps_its_past_cpu_in_the_tree_and_not_its_future(tmp_path: Path) -> None:
    """A pod's main process killed orphans its workers: what they took in the tree stays the benchmark's
    (before: the tree's CPU fell by it, read as a spike of foreign cores), what they take later is not."""
    burned, go, again = tmp_path / "burned", tmp_path / "go", tmp_path / "again"
    child = (
        BURN.format(s=0.6)
        + f"open({str(burned)!r}, 'w').close()\n"
        + f"import os\nwhile not os.path.exists({str(again)!r}): time.sleep(0.02)\n"
        + BURN.format(s=0.5)
    )
    parent = (
        "import os, subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, '-c', {child!r}])\n"
        f"while not os.path.exists({str(go)!r}): time.sleep(0.02)\n"  # exits: the child is orphaned
    )
    tree = TreeCpu(os.getpid())
    tree.sample()
    proc = subprocess.Popen([sys.executable, "-c", parent])
    deadline = time.monotonic() + 30
    _wait_for(burned, deadline)
    in_tree = tree.sample()
    go.touch()
    proc.wait()
    orphaned = tree.sample()
    assert orphaned >= in_tree - 0.05, "the orphan's past CPU left the tree's count"
    again.touch()
    time.sleep(0.8)  # the orphan burns its 0.5 s and exits (reaped by init, outside the tree)
    after = tree.sample()
    assert orphaned >= 0.6 and after - orphaned < 0.3, (in_tree, orphaned, after)


def test_summary_marks_a_part_loaded_by_foreign_cpu_only() -> None:
    def samples(own_per_s: float, busy_per_s: float) -> list[dict[str, float]]:
        return [{"t": t, "busy": busy_per_s * t, "own": own_per_s * t, "load": 3.0} for t in range(0, 11, 2)]

    own_heavy = summarize(samples(own_per_s=1.9, busy_per_s=2.0), load_before=0.1)
    assert own_heavy["quiet"] and own_heavy["foreign_cores_mean"] == 0.1
    loaded = summarize(samples(own_per_s=1.0, busy_per_s=2.0), load_before=4.0)
    assert not loaded["quiet"] and loaded["foreign_cores_mean"] == 1.0 > QUIET_FOREIGN_CORES
    assert loaded["load_avg_1min_before"] == 4.0 and loaded["load_avg_1min_max"] == 3.0


def test_a_loaded_part_does_not_replace_the_published_result(tmp_path: Path) -> None:
    (tmp_path / "recovery_pods.json").write_text('{"new": true}')
    load = {"foreign_cores_mean": 1.2}
    said = bench_main.keep_or_set_aside(tmp_path, "pods", b'{"old": true}', load)
    assert (tmp_path / "recovery_pods.json").read_text() == '{"old": true}'
    assert (tmp_path / "loaded" / "recovery_pods.json").read_text() == '{"new": true}'
    assert "not published" in said and "1.20 cores" in said
    # Nothing published before: the loaded result is only set aside.
    (tmp_path / "synth.json").write_text("{}")
    bench_main.keep_or_set_aside(tmp_path, "synth", None, load)
    assert not (tmp_path / "synth.json").exists() and (tmp_path / "loaded" / "synth.json").is_file()
