"""NVRx's helpers forked from the pod's fork server (trainer/checkpoint/helper_server.py), not spawned.

Each test runs a stand-in for the prefork zygote: a process that imports torch, starts the server with
`helper_server.start()` and forks a "worker" (as the zygote forks a rank), which starts helpers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import REPO_ROOT, free_port

ZYGOTE = textwrap.dedent(
    """
    import json
    import os
    import sys


    def report(queue):
        # First, before anything is imported here: what the process began with.
        began_with_torch = "torch" in sys.modules
        import torch

        queue.put({"pid": os.getpid(), "ppid": os.getppid(), "began_with_torch": began_with_torch,
                   "mark": os.environ.get("HELPER_TEST_MARK"), "threads": torch.get_num_threads()})


    def sleep_long():
        import time

        time.sleep(3600)


    def worker(server):
        os.environ["HELPER_TEST_MARK"] = "the worker's"
        os.environ["OMP_NUM_THREADS"] = "1"
        from trainer.checkpoint import helper_server

        if sys.argv[1] == "probe":
            ctx = helper_server.context()
            queue = ctx.SimpleQueue()
            process = ctx.Process(target=report, args=(queue,))
            process.start()
            result = queue.get()
            process.join(30)
            # Read once the server has forked a helper: it closes its parent's files before it serves.
            links = [os.readlink(f"/proc/{server}/fd/{fd}") for fd in os.listdir(f"/proc/{server}/fd")]
            return {**result, "exitcode": process.exitcode, "server_holds_socket": SOCKET in links}
        if sys.argv[1] == "lifeline":  # a helper that watches nothing itself, and a rank SIGKILLed below
            process = helper_server.context().Process(target=sleep_long)
            process.start()
            return {"helper": process.pid}
        if sys.argv[1] == "server-gone":
            os.kill(server, 9)
            while helper_server.running():
                pass
            from nvidia_resiliency_ext.checkpointing.async_ckpt import core

            from trainer.checkpoint import nvrx_async

            nvrx_async.use_helper_server()
            spawn = core.mp.get_context("spawn").get_start_method()
            return {"context": helper_server.context(), "spawn": spawn}
        # "nvrx": NVRx's worker and Manager, as a rank starts them
        import torch.distributed as dist

        from trainer.checkpoint import nvrx_async

        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=sys.argv[2])
        dist.init_process_group("gloo", rank=0, world_size=1)  # NVRx's worker start asks for the rank
        queue = nvrx_async.make_async_queue()
        nvrx_async.prewarm(queue)
        from nvidia_resiliency_ext.checkpointing.async_ckpt import filesystem_async

        import time

        helpers = {"worker": nvrx_async.worker_process(queue).pid,
                   "manager": filesystem_async.get_write_results_queue()._manager._process.pid}
        time.sleep(1.5)  # longer than a watchdog's poll: one that took its parent for the rank has acted
        state = {"alive": nvrx_async.worker_alive(queue)}
        for name, pid in helpers.items():
            with open(f"/proc/{pid}/stat") as stat:
                state[name] = {"pid": pid, "ppid": int(stat.read().rsplit(")", 1)[1].split()[1])}
        return state


    if __name__ == "__main__":
        import socket

        import torch  # the zygote's imports

        from trainer.checkpoint import helper_server

        listening = socket.create_server(("127.0.0.1", 0))  # a socket of the parent's: not the server's
        SOCKET = f"socket:[{os.fstat(listening.fileno()).st_ino}]"
        server = helper_server.start()
        print(json.dumps({"server": server}), flush=True)
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(read_end)
            try:
                os.write(write_end, (json.dumps(worker(server)) + "\\n").encode())
            except BaseException:
                import traceback

                traceback.print_exc()
                os._exit(1)
            if sys.argv[1] in ("nvrx", "lifeline"):  # a rank killed with its helpers running
                os.kill(os.getpid(), 9)
            os._exit(0)
        os.close(write_end)
        with os.fdopen(read_end) as results:
            print(results.readline().strip(), flush=True)
        os.waitpid(pid, 0)
    """
)


def _zygote(tmp_path: Path, *args: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run the stand-in to its end: (what it said of its server, what its worker reported)."""
    script = tmp_path / "zygote.py"
    script.write_text(ZYGOTE)
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    argv = [sys.executable, str(script), *args]
    proc = subprocess.run(argv, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert len(lines) == 2 and lines[1], proc.stdout + proc.stderr[-3000:]
    return json.loads(lines[0]), json.loads(lines[1])


def _gone(pid: int) -> bool:
    """Exited (a zombie nobody reaped yet counts: it runs nothing)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat[stat.rindex(")") + 2] == "Z"


def _wait_gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not _gone(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return _gone(pid)


def test_a_workers_helper_is_forked_by_the_server_with_the_modules_and_the_workers_environment(
    tmp_path: Path,
) -> None:
    said, helper = _zygote(tmp_path, "probe")
    assert said["server"], "no server was started"
    assert helper["ppid"] == said["server"]  # forked by the server, not spawned by the worker
    assert helper["began_with_torch"]  # no second import of torch
    assert helper["mark"] == "the worker's"  # the worker's environment, not the zygote's
    assert helper["threads"] == 1  # and the thread count read from it
    assert helper["exitcode"] == 0
    assert not helper["server_holds_socket"]  # it keeps none of its parent's files
    # The server outlives nobody: the zygote and its worker are gone, so is it.
    assert _wait_gone(said["server"], 10), f"the fork server {said['server']} outlived its zygote"


def test_nvrx_starts_its_worker_and_manager_from_the_server_and_they_die_with_a_killed_rank(
    tmp_path: Path,
) -> None:
    said, helpers = _zygote(tmp_path, "nvrx", str(free_port()))
    assert helpers["alive"], "NVRx's worker ended while its rank ran"
    for name in ("worker", "manager"):
        assert helpers[name]["ppid"] == said["server"], f"NVRx's {name} was not forked by the server"
    # The rank was SIGKILLed: the worker's watchdog (a pidfd of the rank, not its parent) ends both.
    for name in ("worker", "manager"):
        pid = helpers[name]["pid"]
        assert _wait_gone(pid, 10), f"NVRx's {name} {pid} outlived its killed rank"
    assert _wait_gone(said["server"], 10)


def test_any_helper_ends_with_its_rank_and_the_server_with_the_last_of_them(tmp_path: Path) -> None:
    # No watchdog of NVRx's here: the helper's own lifeline (a pidfd of its rank) ends it. Without it the
    # helper lived on, and held the server open (it keeps the server's "alive" pipe, as multiprocessing's
    # forkserver children do): seen in CI, a Manager whose worker exited before its watchdog killed it.
    said, worker = _zygote(tmp_path, "lifeline")
    assert _wait_gone(worker["helper"], 10), f"the helper {worker['helper']} outlived its killed rank"
    assert _wait_gone(said["server"], 10), f"the fork server {said['server']} outlived its zygote"


def test_without_the_server_nvrx_spawns_its_helpers_as_shipped(tmp_path: Path) -> None:
    _, worker = _zygote(tmp_path, "server-gone")
    assert worker == {"context": None, "spawn": "spawn"}


def test_a_python_whose_fork_server_is_unknown_starts_none(monkeypatch: pytest.MonkeyPatch) -> None:
    from multiprocessing import forkserver

    from trainer.checkpoint import helper_server

    def main(listener_fd: int, alive_r: int, preload: Any, *, authkey_r: Any = None) -> None:
        raise AssertionError("must not be called")

    monkeypatch.setattr(forkserver, "main", main)
    monkeypatch.setattr(helper_server, "_server_pidfd", None)  # this test process's own server (conftest)
    assert helper_server.start() is None
    assert helper_server.context() is None
    # What the tests above rely on: this Python's fork server is the one the module knows.
    monkeypatch.undo()
    import inspect

    assert tuple(inspect.signature(forkserver.main).parameters) == helper_server._KNOWN_MAIN_PARAMETERS


HERE = textwrap.dedent(
    """
    import json
    import threading
    import time

    from trainer.checkpoint import helper_server

    other = threading.Thread(target=time.sleep, args=(1,))
    other.start()
    with_a_thread = helper_server.start_here()  # a fork would copy the other thread's locks mid-use
    other.join()
    alone = helper_server.start_here()
    again = helper_server.start_here()  # there is one
    print(json.dumps([with_a_thread, alone, again, helper_server.context() is not None]))
    """
)


def test_a_rank_no_zygote_forked_starts_its_own_server_while_it_runs_one_thread() -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", HERE], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    with_a_thread, alone, again, usable = json.loads(proc.stdout)
    assert with_a_thread is None and isinstance(alone, int) and again is None and usable
    assert _wait_gone(alone, 10), "the rank's fork server outlived it"
