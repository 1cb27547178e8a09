"""`python -m trainer.launcher COMMAND...`: the trainer container's command (Contract 2 of docs/design.md):
start the pod's zygote (trainer/launcher/prefork/), then exec COMMAND (ft_launcher).

ft_launcher is exec'd as `python -m trainer.launcher.ft <its path> ...`: NVRx's launcher in the same
process, with the launcher patches of trainer/launcher/patches.py applied.

For ft_launcher this process stays the container's main process and supervises it
(trainer/launcher/supervise.py): signals from the kubelet are forwarded, and ft_launcher is started again
on this pod when the job's rendezvous service was replaced. Any other COMMAND is exec'd. The zygote is
this process's child and dies with it. The zygote's socket lives in a fresh 0700 directory under the
temporary dir (the pod's /tmp scratch volume), named to COMMAND and its workers by the environment.

A zygote that dies while ft_launcher runs (SIGKILL from outside, the OOM killer) costs the job nothing
now: the workers it forked train on (their stand-ins take the exit status from the worker itself,
prefork/client.py), and the supervisor starts a fresh zygote on the same socket at once (`Zygote`, at
most `ZYGOTE_RESTARTS` times per pod). A worker started while the new one still imports waits for it
(its PID file, prefork.PID_FILE_SUFFIX), as a worker of the pod's first round waits for the first.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence

from trainer.launcher.podfiles import write_atomically
from trainer.launcher.prefork import PID_ENV, PID_FILE_SUFFIX, SOCKET_ENV

ZYGOTE_RESTARTS = 3
"""How often one pod's zygote, dead while ft_launcher runs, is started again (then workers start cold)."""


class Zygote:
    """The pod's zygote process, started again when it dies (see the module doc)."""

    def __init__(self, path: str, entry: Sequence[str], log: Callable[[str], None] | None = None) -> None:
        self.path, self.entry = path, list(entry)
        self.log = log or (lambda m: print(f"trainer.launcher: {m}", file=sys.stderr, flush=True))
        self.restarts = 0
        self.proc = self._start()

    def _start(self) -> subprocess.Popen[bytes]:
        if os.path.exists(self.path):  # a dead zygote's socket: the new one binds the same path
            os.unlink(self.path)
        argv = [sys.executable, "-m", "trainer.launcher.prefork.server", self.path, str(os.getpid())]
        proc = subprocess.Popen([*argv, *self.entry], stdin=subprocess.DEVNULL)
        write_atomically(self.path + PID_FILE_SUFFIX, str(proc.pid))
        return proc

    def pids(self) -> frozenset[int]:
        """The live zygote's PID, for the supervisor to keep; called at each of its polls, it replaces a
        zygote that died (reaping it)."""
        rc = self.proc.poll()
        if rc is not None and self.restarts < ZYGOTE_RESTARTS:
            self.restarts += 1
            self.log(
                f"the zygote ended ({'signal ' + str(-rc) if rc < 0 else 'exit ' + str(rc)}); its workers "
                f"train on; starting a fresh zygote (restart {self.restarts})"
            )
            self.proc = self._start()
        return frozenset({self.proc.pid})


def main(argv: list[str]) -> int:
    command = argv[1:] if argv[:1] == ["--"] else argv
    if not command:
        print("usage: python -m trainer.launcher [--] COMMAND [ARG...]", file=sys.stderr)
        return 2
    found = shutil.which(command[0])
    if found is None:
        print(f"trainer.launcher: {command[0]}: command not found", file=sys.stderr)
        return 127
    path = os.path.join(tempfile.mkdtemp(prefix="trainer-prefork-"), "zygote.sock")
    entry = entry_module(command)
    zygote = Zygote(path, entry)
    os.environ[SOCKET_ENV] = path
    os.environ[PID_ENV] = str(zygote.proc.pid)
    if os.path.basename(command[0]) == "ft_launcher":
        # NVRx's launcher with the patches of trainer/launcher/patches.py (ft.py), as a child of this
        # process, which restarts it when the job's rendezvous service was replaced (supervise.py).
        from trainer.launcher.beat import rdzv_endpoint
        from trainer.launcher.supervise import supervise

        ft = [sys.executable, "-m", "trainer.launcher.ft", found, *command[1:]]
        epoch_file = os.path.join(os.path.dirname(path), "rendezvous.epoch")
        return supervise(ft, rdzv_endpoint(command[1:]), epoch_file, keep=zygote.pids)
    os.execvp(command[0], command)
    return 127  # pragma: no cover - execvp returns only by raising


def entry_module(command: list[str]) -> list[str]:
    """The module of the workers' `--entrypoint=module:function` (after `-m trainer`, before `--`), for
    the zygote to import once; [] when there is none or it is not a plain module name."""
    if "trainer" not in command or command[command.index("trainer") - 1] != "-m":
        return []
    args = command[command.index("trainer") + 1 :]
    args = args[: args.index("--")] if "--" in args else args
    from trainer.config.components import ENTRYPOINT_PATTERN  # stdlib only: the launcher stays light

    for arg in args:
        value = arg.removeprefix("--entrypoint=")
        if value != arg and ENTRYPOINT_PATTERN.fullmatch(value):
            return [value.partition(":")[0]]
    return []


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
