"""The pod's main process while ft_launcher runs: restart ft_launcher on the same pod when the job's
rendezvous service was replaced, instead of failing the pod.

With the rendezvous service (trainer/launcher/rendezvous.py) no pod hosts the launchers' store, but the
store itself can still go: its pod deleted, its node drained. Every launcher's store client then fails,
NVRx's ft_launcher stops its workers and exits 1, and the Job controller would replace every pod (each
exit counted against the backoff limit, every /dev/shm snapshot gone with its pod). The pod, its node and
its snapshots are fine; only the rendezvous state is gone. So the pod's main process stays this
supervisor, ft_launcher its child, and when ft_launcher exits non-zero:

* the store at the rendezvous endpoint carries a different epoch (`EPOCH_KEY`, written by each new
  service process) than the one this pod joined: the service was replaced; start ft_launcher again
  with the same command. Its workers restore from this pod's /dev/shm (and peers): one restart round;
* the same epoch, or no epoch ever seen (a launcher-hosted store: torchrun, `is_host`): ft_launcher
  failed for its own reasons; exit with its status, as before;
* the endpoint stays unreachable for `REJOIN_WAIT_S`: exit with ft_launcher's status.

The supervisor itself never imports torch (it would hold a second copy of it in every pod): ft_launcher's
process, which has the store client library loaded anyway, writes the epoch it joined under to
`EPOCH_FILE_ENV` (trainer/launcher/ft.py), and after a failure one short-lived
`python -m trainer.launcher.supervise --wait-epoch` reads the service's epoch again.

Signals the kubelet sends (SIGTERM, SIGINT) are forwarded to ft_launcher and end supervision: a pod that
is being stopped is never restarted. The supervisor leads the pod's process group, as the exec'd
ft_launcher did, so the node-loss fault (trainer/faults.py) still kills the whole pod through
`SUPERVISOR_PID_ENV`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from datetime import timedelta

SUPERVISOR_PID_ENV = "TRAINER_SUPERVISOR_PID"
"""The supervisor's pid, in ft_launcher's environment (and so its workers'): the pod's main process."""
EPOCH_FILE_ENV = "TRAINER_RENDEZVOUS_EPOCH_FILE"
"""Where ft_launcher's process writes the epoch of the rendezvous service it reached (trainer/launcher/ft.py)."""
REJOIN_WAIT_S = 120.0
"""How long a launcher that lost its store waits for a rendezvous service to answer again."""
POLL_S = 0.25


def read_epoch(endpoint: str, timeout_s: float = 2.0) -> str | None:
    """The rendezvous service's epoch at `endpoint` (host:port), or None when nothing answers or the store
    has no epoch (a store hosted by a launcher)."""
    import torch.distributed as dist

    from trainer.launcher.rendezvous import EPOCH_KEY
    from trainer.resilience.liveness import parse_endpoint

    try:
        host, port = parse_endpoint(endpoint, "--rdzv-endpoint")
        store = dist.TCPStore(
            host, port, is_master=False, timeout=timedelta(seconds=timeout_s), wait_for_workers=False
        )
        if not store.check([EPOCH_KEY]):
            return None
        return bytes(store.get(EPOCH_KEY)).decode(errors="replace")
    except (RuntimeError, ValueError, OSError):  # DistStoreError/DistNetworkError are RuntimeErrors
        return None


def write_epoch_when_reachable(endpoint: str, path: str, stop: threading.Event | None = None) -> None:
    """ft_launcher's side: read the service's epoch once it answers and write it to `path` (atomically).
    Gives up quietly on a store without an epoch (a launcher-hosted store)."""
    while stop is None or not stop.is_set():
        epoch = read_epoch(endpoint)
        if epoch is not None:
            tmp = f"{path}.tmp"
            with open(tmp, "w") as fh:
                fh.write(epoch)
            os.replace(tmp, path)
            return
        time.sleep(POLL_S * 4)


def wait_for_other_epoch(endpoint: str, epoch: str, wait_s: float) -> str | None:
    """The epoch of a service at `endpoint` that differs from `epoch`, waiting up to `wait_s` for one to
    answer; None when the same service answers (it was not replaced) or none does in time."""
    deadline = time.monotonic() + wait_s
    while True:
        current = read_epoch(endpoint)
        if current is not None:
            return current if current != epoch else None
        if time.monotonic() >= deadline:
            return None
        time.sleep(POLL_S)


class Supervisor:
    """Runs `command` (ft_launcher's) as a child; restarts it when the rendezvous service was replaced."""

    def __init__(
        self,
        command: Sequence[str],
        endpoint: str | None,
        epoch_file: str,
        *,
        other_epoch: Callable[[str, str, float], str | None] | None = None,
        rejoin_wait_s: float = REJOIN_WAIT_S,
        log: Callable[[str], None] = lambda m: print(f"trainer.launcher: {m}", file=sys.stderr, flush=True),
    ) -> None:
        self.command = list(command)
        self.endpoint = endpoint
        self.epoch_file = epoch_file
        self.other_epoch = other_epoch or _other_epoch_in_subprocess
        self.rejoin_wait_s = rejoin_wait_s
        self.log = log
        self.restarts = 0
        self.stopping = False
        self._child: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()

    def forward(self, signum: int, _frame: object = None) -> None:
        """A signal for the pod: pass it to ft_launcher and never restart it again."""
        self.stopping = True
        with self._lock:
            if self._child is not None and self._child.poll() is None:
                self._child.send_signal(signum)

    def joined_epoch(self) -> str | None:
        """The epoch ft_launcher's process wrote (None: it never reached a service with one)."""
        try:
            with open(self.epoch_file) as fh:
                return fh.read().strip() or None
        except OSError:
            return None

    def run(self) -> int:
        env = {**os.environ, SUPERVISOR_PID_ENV: str(os.getpid()), EPOCH_FILE_ENV: self.epoch_file}
        while True:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.epoch_file)
            with self._lock:
                if self.stopping:
                    return 128 + signal.SIGTERM
                self._child = subprocess.Popen(self.command, env=env)
            rc = self._child.wait()
            if rc == 0 or self.stopping:
                return _exit_status(rc)
            epoch = self.joined_epoch()
            if not self.endpoint or epoch is None:
                return _exit_status(rc)
            new = self.other_epoch(self.endpoint, epoch, self.rejoin_wait_s)
            if new is None or self.stopping:
                return _exit_status(rc)
            self.restarts += 1
            self.log(
                f"ft_launcher exited {rc}: the rendezvous service was replaced (epoch {epoch} -> {new}); "
                f"starting ft_launcher again on this pod (restart {self.restarts})"
            )


def _other_epoch_in_subprocess(endpoint: str, epoch: str, wait_s: float) -> str | None:
    proc = subprocess.run(
        [sys.executable, "-m", "trainer.launcher.supervise", "--wait-epoch", endpoint, epoch, str(wait_s)],
        capture_output=True,
        text=True,
        check=False,
    )
    return proc.stdout.strip() or None if proc.returncode == 0 else None


def _exit_status(rc: int) -> int:
    """A child's returncode as this process's exit status (a signal as 128 + its number, as a shell)."""
    return 128 - rc if rc < 0 else rc


def supervise(command: Sequence[str], endpoint: str | None, epoch_file: str) -> int:
    """Run ft_launcher's `command` under a Supervisor with the pod's signals forwarded."""
    supervisor = Supervisor(command, endpoint, epoch_file)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, supervisor.forward)
    return supervisor.run()


def main(argv: list[str]) -> int:
    """`--wait-epoch ENDPOINT EPOCH WAIT_S`: print another service's epoch (exit 0) or exit 1."""
    if len(argv) != 4 or argv[0] != "--wait-epoch":
        print("usage: python -m trainer.launcher.supervise --wait-epoch ENDPOINT EPOCH WAIT_S", file=sys.stderr)
        return 2
    new = wait_for_other_epoch(argv[1], argv[2], float(argv[3]))
    if new is None:
        return 1
    print(new)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
