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

And when ft_launcher itself was killed by a signal nobody here sent (SIGKILL from outside, the OOM
killer), the pod is fine too: its workers, rank monitors and their helpers, reparented to this process
(it is PID 1 in the container, and a child subreaper everywhere else), are killed and reaped, and
ft_launcher starts again (at most `LAUNCHER_RESTARTS` times per pod): it joins the next round as a new
node, which costs the job one restart round instead of a replaced pod. The zygote is kept.

Either restart is warm: a few seconds after each ft_launcher reached the service (STANDBY_DELAY_S), the
supervisor starts the next one, `python -m trainer.launcher.ft --standby FT_LAUNCHER`, which imports
torch and NVRx and waits on a pipe (trainer/launcher/standby.py), and hands it ft_launcher's command line
when the serving one has ended: no cold import (11 s on a loaded 2-core machine) between the loss and a
launcher that joins. The standby holds no port, device or NVRx state until then, is kept out of the
leftovers ended after a kill, and dies with this process; one that dies unused is replaced, at most
STANDBY_FAILURES times, and without one a start is cold, as before.

The supervisor itself never imports torch (it would hold a second copy of it in every pod): ft_launcher's
process, which has the store client library loaded anyway, writes the epoch it joined under to
`EPOCH_FILE_ENV` (trainer/launcher/ft.py) and, when it fails, what answers at the endpoint then
(`record_service_after_failure`: another epoch, or none) to the verdict file beside it. Only when
ft_launcher ended without a verdict does one short-lived `python -m trainer.launcher.supervise
--wait-epoch` read the service's epoch again: it imports torch, which would delay every failing pod's
exit by seconds.

The supervisor also keeps the pod's presence listener open (trainer/launcher/presence.py): a port that
answers for as long as the pod lives, and refuses once it is gone, so its peers record its ranks as
terminated at once (trainer/resilience/lostpods.py).

Signals the kubelet sends (SIGTERM, SIGINT) are forwarded to ft_launcher and end supervision: a pod that
is being stopped is never restarted. SIGUSR1 comes from the pod's own worker when the straggler watch
evicts this node (trainer/runtime/straggler_watch.py): ft_launcher is SIGKILLed (as a node loss would, so
it neither stops the job's rendezvous nor waits for its workers), its leftovers are ended, and the pod
exits `EVICTED_EXIT`, which the chart's podFailurePolicy does not count; the hot spare takes its place.
The supervisor leads the pod's process group, as the exec'd ft_launcher did, so the node-loss fault
(trainer/runtime/faults.py) still kills the whole pod through `SUPERVISOR_PID_ENV`.
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
from typing import Any

from trainer.launcher.podfiles import write_atomically
from trainer.launcher.presence import PRESENCE_PORT_ENV, PresenceListener
from trainer.launcher.reaping import become_subreaper, children_now, end_orphans, reap_orphans
from trainer.launcher.standby import STANDBY_DELAY_S, STANDBY_FLAG, Standby

SUPERVISOR_PID_ENV = "TRAINER_SUPERVISOR_PID"
"""The supervisor's pid, in ft_launcher's environment (and so its workers'): the pod's main process."""
CLAIM_FILE_ENV = "TRAINER_RENDEZVOUS_CLAIM_FILE"
"""Where ft_launcher's process remembers the group rank its pod last held, across the launchers this
supervisor starts (trainer/launcher/patches.py `claim_previous_rank`): a replaced rendezvous service
gets it back as a claim. It lives beside the epoch file and, like the pod's snapshots, dies with the pod."""
CLAIM_FILE_NAME = "rendezvous.rank"
LAUNCHER_ID_ENV = "TRAINER_LAUNCHER_ID"
"""A fresh id per ft_launcher process, set by trainer/launcher/ft.py for its workers."""
EPOCH_FILE_ENV = "TRAINER_RENDEZVOUS_EPOCH_FILE"
"""Where ft_launcher's process writes the epoch of the rendezvous service it reached
(trainer/launcher/ft.py)."""
VERDICT_SUFFIX = ".after-failure"
"""The verdict file, `<epoch file>.after-failure`: the epoch of the service that replaced the one joined, or
empty when none did (record_service_after_failure)."""
REJOIN_WAIT_S = 120.0
"""How long a launcher that lost its store waits for a rendezvous service to answer again."""
POLL_S = 0.25
EVICTED_EXIT = 95
"""A straggler's pod leaving: trainer/resilience/straggler.py EVICTED_EXIT (this module imports no torch)."""
LAUNCHER_RESTARTS = 3
"""How often one pod's ft_launcher, killed from outside, is started again before the pod gives up."""
STANDBY_LATE_S = 30.0
"""When ft_launcher reaches no service (a launcher-hosted store), how long after its start."""
STANDBY_FAILURES = 3
"""Standbys that died before their use, after which this pod's starts are cold."""
Kept = frozenset[int] | Callable[[], frozenset[int]]
"""The supervisor's other children: fixed PIDs, or a function that returns them (and may replace one)."""


def _client(endpoint: str, timeout_s: float) -> Any:
    """A client of the store at `endpoint` (host:port); raises when nothing answers within `timeout_s`."""
    import torch.distributed as dist

    from trainer.resilience.liveness import parse_endpoint

    host, port = parse_endpoint(endpoint, "--rdzv-endpoint")
    return dist.TCPStore(
        host, port, is_master=False, timeout=timedelta(seconds=timeout_s), wait_for_workers=False
    )


def read_epoch(endpoint: str, timeout_s: float = 2.0) -> str | None:
    """The rendezvous service's epoch at `endpoint` (host:port), or None when nothing answers or the store
    has no epoch (a store hosted by a launcher)."""
    return read_service(endpoint, timeout_s)[0]


def read_service(endpoint: str, timeout_s: float = 2.0) -> tuple[str | None, bool]:
    """(read_epoch, whether that store is the one the service started after a failed rendezvous)."""
    from trainer.launcher.rendezvous import EPOCH_KEY, FOLLOWS_FAILURE_KEY

    try:
        store = _client(endpoint, timeout_s)
        if not store.check([EPOCH_KEY]):
            return None, False
        return bytes(store.get(EPOCH_KEY)).decode(errors="replace"), store.check([FOLLOWS_FAILURE_KEY])
    except (RuntimeError, ValueError, OSError):  # DistStoreError/DistNetworkError are RuntimeErrors
        return None, False


FAILED_ROUND_WAIT_S = 30.0
"""How long a starting launcher waits for the fresh rendezvous when the store it reaches holds one that
closed with a failure: NVRx's service keeps the closed store 3 s for its launchers to read the reason."""


def wait_past_failed_rendezvous(endpoint: str, run_id: str, wait_s: float = FAILED_ROUND_WAIT_S) -> bool:
    """ft_launcher's side, before it joins: when the store at `endpoint` holds rendezvous `run_id` closed
    with a failure (trainer/launcher/rendezvous.py serves a fresh store once NVRx's read grace is over),
    wait until another epoch answers. A pod the Job controller re-created within that grace would join the
    closed rendezvous, lose the store when the grace ends, and fail once more, a retry wasted. Returns
    whether it waited; proceeds after `wait_s` or when nothing answers (NVRx's own connect wait then)."""
    from trainer.launcher.rendezvous import EPOCH_KEY, RESTARTED_AFTER, shutdown_reason
    from trainer.resilience.lostpods import Presence, probe

    # Nothing listens yet when this launcher is to host the store itself (a local run) or the service is
    # being replaced: a refused connect answers at once, where a store client retries it for its whole
    # timeout (2 s of every such start).
    if probe(endpoint, timeout_s=1.0) is not Presence.THERE:
        return False
    try:
        store = _client(endpoint, 2.0)
        if not store.check([EPOCH_KEY]) or shutdown_reason(store, run_id) not in RESTARTED_AFTER:
            return False
        closed = bytes(store.get(EPOCH_KEY)).decode(errors="replace")
    except (RuntimeError, ValueError, OSError):
        return False
    del store  # a client of the closed store must not outlive it
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        time.sleep(POLL_S / 5)
        current = read_epoch(endpoint, timeout_s=1.0)
        if current is not None and current != closed:
            break
    return True


def write_epoch_when_reachable(endpoint: str, path: str, stop: threading.Event | None = None) -> None:
    """ft_launcher's side: read the service's epoch once it answers and write it to `path` (atomically).
    Gives up quietly on a store without an epoch (a launcher-hosted store)."""
    while stop is None or not stop.is_set():
        epoch = read_epoch(endpoint)
        if epoch is not None:
            write_atomically(path, epoch)
            return
        time.sleep(POLL_S * 4)


def wait_for_other_epoch(endpoint: str, epoch: str, wait_s: float) -> str | None:
    """The epoch of a service at `endpoint` that differs from `epoch`, waiting up to `wait_s` for one to
    answer; None when the same service answers (it was not replaced), when the other store is the fresh
    rendezvous the service started after a failed one (the pod fails and the Job controller retries it,
    within the Job's limits: trainer/launcher/rendezvous.py), or when none answers in time."""
    deadline = time.monotonic() + wait_s
    while True:
        current, follows_failure = read_service(endpoint)
        if current is not None:
            return current if current != epoch and not follows_failure else None
        if time.monotonic() >= deadline:
            return None
        time.sleep(POLL_S)


def record_service_after_failure(endpoint: str, epoch_file: str, wait_s: float = REJOIN_WAIT_S) -> None:
    """ft_launcher's side, as it is about to exit non-zero: whether the service it joined was replaced,
    for the supervisor (the verdict file: the other service's epoch, or empty for "not replaced"). Waits
    up to `wait_s` for a service to answer, as the supervisor's own check would; writes nothing when this
    launcher never learnt an epoch (a launcher-hosted store)."""
    try:
        with open(epoch_file) as fh:
            joined = fh.read().strip()
    except OSError:
        return
    if joined:
        write_atomically(epoch_file + VERDICT_SUFFIX, wait_for_other_epoch(endpoint, joined, wait_s) or "")


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
        standby: Sequence[str] | None = None,
        log: Callable[[str], None] = lambda m: print(f"trainer.launcher: {m}", file=sys.stderr, flush=True),
    ) -> None:
        """`standby`: the command of a warm standby for `command` (trainer/launcher/standby.py), kept
        waiting while ft_launcher runs and handed its next start; None: every start is cold."""
        self.command = list(command)
        self.standby_command = list(standby) if standby else None
        self.standby: Standby | None = None
        self.standby_failures = 0
        self.warm_starts = 0
        self.endpoint = endpoint
        self.epoch_file = epoch_file
        self.other_epoch = other_epoch or _other_epoch_in_subprocess
        self.rejoin_wait_s = rejoin_wait_s
        self.log = log
        self.restarts = 0
        self.stopping = False
        self.evicted = False
        self._child: subprocess.Popen[bytes] | None = None
        self._lock = threading.Lock()

    def forward(self, signum: int, _frame: object = None) -> None:
        """A signal for the pod: pass it to ft_launcher and never restart it again."""
        self.stopping = True
        with self._lock:
            if self._child is not None and self._child.poll() is None:
                self._child.send_signal(signum)

    def evict(self, _signum: int = signal.SIGUSR1, _frame: object = None) -> None:
        """This node was evicted as a straggler: end ft_launcher at once; `run` then exits EVICTED_EXIT."""
        self.evicted = self.stopping = True
        with self._lock:
            if self._child is not None and self._child.poll() is None:
                self._child.kill()

    def joined_epoch(self) -> str | None:
        """The epoch ft_launcher's process wrote (None: it never reached a service with one)."""
        try:
            with open(self.epoch_file) as fh:
                return fh.read().strip() or None
        except OSError:
            return None

    def service_after_failure(self, epoch: str) -> str | None:
        """The epoch of the service that replaced the one joined under `epoch`, or None: ft_launcher's
        verdict when it wrote one, else this process's own check (a short-lived interpreter)."""
        try:
            with open(self.epoch_file + VERDICT_SUFFIX) as fh:
                return fh.read().strip() or None
        except OSError:
            assert self.endpoint is not None
            return self.other_epoch(self.endpoint, epoch, self.rejoin_wait_s)

    def run(self, keep: Kept = frozenset()) -> int:
        """Supervise until ft_launcher ends for good; `keep`: children that are not ft_launcher's
        leftovers (the zygote), or a function called at each poll that returns them."""
        try:
            return self._run(keep)
        finally:
            if self.standby is not None:
                self.standby.stop()
                self.standby = None

    def _launch(self, env: dict[str, str]) -> subprocess.Popen[bytes]:
        """Start ft_launcher: hand the start to the standby when one waits, else cold."""
        standby, self.standby = self.standby, None
        if standby is not None:
            proc = standby.start(self.command)
            if proc is not None:
                self.warm_starts += 1
                return proc
            self.standby_failures += 1
            self.log("the standby ft_launcher was gone; starting ft_launcher cold")
        return subprocess.Popen(self.command, env=env)

    def _keep_standby(self, env: dict[str, str], due: float | None) -> None:
        """Start a standby once `due` (monotonic) passed, and again when one died before its use (at
        most STANDBY_FAILURES times: a standby that cannot start is not worth a process a poll)."""
        if self.standby is not None and self.standby.proc.poll() is not None:
            self.standby_failures += 1
            self.log(f"the standby ft_launcher ended ({self.standby.proc.returncode}) before it was needed")
            self.standby = None
        if (
            self.standby is None
            and self.standby_command
            and self.standby_failures < STANDBY_FAILURES
            and due is not None
            and time.monotonic() >= due
        ):
            self.standby = Standby(self.standby_command, env)

    def _standby_pids(self) -> frozenset[int]:
        return frozenset({self.standby.pid}) if self.standby is not None else frozenset()

    def _standby_due(self, started: float, due: float | None) -> float | None:
        """When the next standby should start: STANDBY_DELAY_S after the serving ft_launcher reached the
        service (its own imports and the start of its workers are over by then), or STANDBY_LATE_S after
        its start when it reaches none (a launcher-hosted store)."""
        if due is not None or self.standby_command is None:
            return due
        if self.joined_epoch() is not None:
            return time.monotonic() + STANDBY_DELAY_S
        return started + STANDBY_LATE_S if not self.endpoint else None

    def _run(self, keep: Kept) -> int:
        own = children_now()  # there before ft_launcher: none of them can be its leftovers

        def kept() -> frozenset[int]:
            return (keep() if callable(keep) else keep) | own

        env = {
            **os.environ,
            SUPERVISOR_PID_ENV: str(os.getpid()),
            EPOCH_FILE_ENV: self.epoch_file,
            CLAIM_FILE_ENV: os.path.join(os.path.dirname(os.path.abspath(self.epoch_file)), CLAIM_FILE_NAME),
        }
        killed_restarts = 0
        while True:
            for stale in (self.epoch_file, self.epoch_file + VERDICT_SUFFIX):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(stale)
            with self._lock:
                if self.evicted:
                    return EVICTED_EXIT
                if self.stopping:
                    return 128 + signal.SIGTERM
                self._child = self._launch(env)
            child = self._child
            started, due = time.monotonic(), None
            while (rc := child.poll()) is None:
                due = self._standby_due(started, due)
                self._keep_standby(env, due)
                reap_orphans(kept() | {child.pid} | self._standby_pids())
                time.sleep(POLL_S)
            if self.evicted:
                left = end_orphans(kept() | {child.pid} | self._standby_pids())
                self.log(f"evicted as a straggler: ended ft_launcher and its {left} processes; leaving")
                return EVICTED_EXIT
            if rc == 0 or self.stopping:
                return _exit_status(rc)
            if rc < 0 and killed_restarts < LAUNCHER_RESTARTS:
                killed_restarts += 1
                left = end_orphans(kept() | {child.pid} | self._standby_pids())
                self.restarts += 1
                self.log(
                    f"ft_launcher was killed by signal {-rc} from outside; ended its {left} leftover "
                    f"processes, starting ft_launcher again on this pod (restart {self.restarts})"
                )
                continue
            epoch = self.joined_epoch()
            if not self.endpoint or epoch is None:
                return _exit_status(rc)
            new = self.service_after_failure(epoch)
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


def supervise(command: Sequence[str], endpoint: str | None, epoch_file: str, keep: Kept = frozenset()) -> int:
    """Run ft_launcher's `command` under a Supervisor with the pod's signals forwarded; `keep`: this
    process's other children (the zygote), never taken for ft_launcher's leftovers."""
    supervisor = Supervisor(command, endpoint, epoch_file, standby=standby_command(command))
    # Open for as long as this process (the pod) lives: peers tell a lost pod by a refused connection.
    listener = PresenceListener()
    os.environ[PRESENCE_PORT_ENV] = str(listener.port)
    become_subreaper()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, supervisor.forward)
    signal.signal(signal.SIGUSR1, supervisor.evict)
    return supervisor.run(keep)


def standby_command(command: Sequence[str]) -> list[str] | None:
    """The warm standby of ft_launcher's `command` (`python -m trainer.launcher.ft FT_LAUNCHER ...`):
    the same module and FT_LAUNCHER, waiting for the rest (trainer/launcher/ft.py `standby`)."""
    head = list(command[:3])
    if len(command) < 4 or head[1:] != ["-m", "trainer.launcher.ft"]:
        return None
    return [*head, STANDBY_FLAG, command[3]]


def main(argv: list[str]) -> int:
    """`--wait-epoch ENDPOINT EPOCH WAIT_S`: print another service's epoch (exit 0) or exit 1."""
    if len(argv) != 4 or argv[0] != "--wait-epoch":
        print(
            "usage: python -m trainer.launcher.supervise --wait-epoch ENDPOINT EPOCH WAIT_S", file=sys.stderr
        )
        return 2
    new = wait_for_other_epoch(argv[1], argv[2], float(argv[3]))
    if new is None:
        return 1
    print(new)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
