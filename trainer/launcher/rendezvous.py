"""`python -m trainer.launcher.rendezvous NVRX_CONTROL_ARGS...`: the job's rendezvous service.

The launchers' rendezvous store (a c10d TCPStore) and the closing of NVRx's barrier rounds are not in
pod 0's ft_launcher (NVRx's default): losing pod 0 would take the store with it, every other launcher
would exit 1 and the Job controller would replace every pod (docs/failure-domains.md). This process holds
them instead, in a pod of
its own (the chart's `<release>-rendezvous` Deployment and Service); every launcher is a store client
(`is_host=0`). It is NVRx's own control node (`nvrx-control`, nvidia_resiliency_ext's
fault_tolerance/control_plane.py: the store host that closes rounds without joining them), with two
additions:

* an **epoch**: a random value written under `EPOCH_KEY` when the store is created. A launcher whose
  store connection broke reads it from the store it reconnects to: a different value means the service
  was replaced and its rounds are gone, which trainer/launcher/supervise.py turns into one restart
  round (a new ft_launcher on the same pod) instead of a failed pod;
* **sticky group ranks** (trainer/launcher/patches.py `sticky_group_ranks`): a node active in the last
  round keeps its group rank, so a survivor's /dev/shm snapshots stay its own and only the node that
  takes a lost one's place restores from a peer;
* **quick polls** (`quick_rendezvous_polls`): NVRx's host looks for an opened round and at a filling one once
  a second; a launcher that hosts never waited for the first, this process does, so it polls every
  50 ms (and checks a round of N nodes every max(50 ms, N/2000 s));
* **staying up once the job's rendezvous is shut down** (the launchers close it when the run ends): the
  store stays readable for launchers still finishing, and the Deployment does not restart it into an
  empty store nobody joins. SIGTERM ends it;
* **a fresh rendezvous after a failed one**: when a launcher ran out of restarts, NVRx closes the
  rendezvous with the reason `failure` and every launcher exits 1, so every pod fails and the Job
  controller re-creates it (the chart's podRetriesPerIndex: the job-restart tier). In the closed store
  the new pods' launchers found the rendezvous shut down and failed at once, each retry wasted (seen
  with bench.recovery's exception/full run through this service). After a `failure` close this process
  serves a new store (a new epoch, marked `FOLLOWS_FAILURE_KEY`) on the same port; after a graceful
  close (the run completed) or a no-restart stop (exit 93, which fails the Job at once) it keeps the
  closed one. A pod's supervisor never takes the new epoch for a replaced service
  (trainer/launcher/supervise.py): the pod fails as it would have, and its retry is the Job's, bounded
  by the Job's limits;
* **a warm standby**: the container's main process (`Keeper`, no torch) is not the service itself. It
  runs the serving process (`python -m trainer.launcher.rendezvous ARGS`) and, once that listens, a
  second one that has imported torch and NVRx and waits on a pipe (trainer/launcher/standby.py; it holds
  no port). When the serving process is killed (SIGKILL from outside, the OOM killer), the Keeper ends
  what it left, hands the standby the start, and that process serves a new store on the same port of
  the same pod as soon as the port is free: no cold import of torch (9.5 s on a loaded 2-core machine)
  and no container restart between the loss and a store that answers. It is a new store all the same (a
  new epoch): the launchers' store clients broke with the old one and torch's TCPStore client does not
  reconnect, NVRx's rounds were in it, so every launcher exits and its pod's supervisor starts
  ft_launcher again, from that pod's own warm standby (trainer/launcher/supervise.py): one restart round.
  SIGTERM/SIGINT go to the serving process and end the service; a serving process that exits by itself
  ends the container with its status, as before. The Keeper's own loss is the container's: restarted
  cold by the kubelet.
"""

from __future__ import annotations

import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from trainer.launcher.beat import rdzv_endpoint
from trainer.launcher.reaping import become_subreaper, children_now, end_orphans, reap_orphans
from trainer.launcher.standby import STANDBY_DELAY_S, STANDBY_FLAG, Standby, await_start, begin

EPOCH_KEY = "trainer/rendezvous/epoch"
"""Key of the service's epoch in its store (a fresh random hex string per store)."""
SERVICE_HANDOVERS = 10
"""How often the service's serving process, killed from outside, is replaced by its standby in one
container; then the container ends with the signal's status and the kubelet restarts it, cold."""
PORT_WAIT_S = 10.0
"""How long a standby handed the start waits for the port to be free before it tries to serve anyway."""
FOLLOWS_FAILURE_KEY = "trainer/rendezvous/follows-failure"
"""Set in a store that this process started after its previous rendezvous closed with a failure."""
RESTARTED_AFTER = frozenset({"failure"})
"""NVRx's shutdown reasons (fault_tolerance/utils.py RDZV_SHUTDOWN_REASON_*) after which pods are
re-created by the Job controller and need a fresh rendezvous. Not `graceful` (the run completed; a late
replacement pod must find it closed and exit 0), `no_progress` or `attribution_stop` (exit 93: the Job
fails at once)."""


def shutdown_reason(store: Any, run_id: str) -> str | None:
    """The reason NVRx recorded when the launchers shut rendezvous `run_id` down (None: not shut down).
    The key is NVRx 0.7's `_RendezvousBarrierState.shutdown_key`; tests/trainer/launcher/test_rendezvous.py
    fails if it moves."""
    key = f"ft_rendezvous_barrier:{run_id}:shutdown"
    if not store.check([key]):
        return None
    return bytes(store.get(key)).decode(errors="replace") or None


def main(argv: list[str]) -> int:
    """The service's main process (`Keeper`), or with STANDBY_FLAG first, a standby service process."""
    if argv[:1] == [STANDBY_FLAG]:
        return standby(argv[1:])
    return Keeper(argv).run()


class Keeper:
    """The service's main process: runs the serving process and a warm standby beside it, and hands the
    standby the start when the serving one is killed (see the module doc). Imports no torch."""

    def __init__(
        self,
        argv: Sequence[str],
        module: str = "trainer.launcher.rendezvous",
        log: Callable[[str], None] = lambda m: print(f"trainer.launcher.rendezvous: {m}", flush=True),
    ) -> None:
        """`module`: what `python -m` runs as the service (the tests' stand-in, else this one)."""
        self.serving_command = [sys.executable, "-m", module, *argv]
        self.standby_command = [sys.executable, "-m", module, STANDBY_FLAG, *argv]
        self.port = _port(argv)
        self.log = log
        self.handovers = 0
        self.stopping = False
        self.standby: Standby | None = None
        self.serving: subprocess.Popen[bytes] | None = None
        self.own: frozenset[int] = frozenset()
        """This process's children before the service's first start: never a dead service's leftovers."""

    def forward(self, signum: int, _frame: object = None) -> None:
        """SIGTERM/SIGINT for the pod: the serving process ends the service; nothing is handed over."""
        self.stopping = True
        if self.serving is not None and self.serving.poll() is None:
            self.serving.send_signal(signum)

    def run(self, poll_s: float = 0.05) -> int:
        """Serve until the serving process ends other than by a signal from outside (or the pod's
        SIGTERM, or after SERVICE_HANDOVERS); its exit status."""
        become_subreaper()
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self.forward)
        self.own = children_now()
        try:
            self.serving = self._start()
            if self.stopping:  # signalled before there was a process to forward it to
                self.serving.terminate()
            while True:
                rc = self._wait(self.serving, poll_s)
                if self.stopping or rc >= 0 or self.handovers >= SERVICE_HANDOVERS:
                    return 128 - rc if rc < 0 else rc
                # A dead service's own children (NVRx's log servers) are ended with it: one might
                # hold its port.
                end_orphans(self._standby_pids() | self.own)
                self.handovers += 1
                self.log(
                    f"the serving process ended (signal {-rc}); its standby takes the port "
                    f"(hand-over {self.handovers})"
                )
                self.serving = self._start()
        finally:
            if self.standby is not None:
                self.standby.stop()

    def _start(self) -> subprocess.Popen[bytes]:
        standby, self.standby = self.standby, None
        proc = standby.start(self.serving_command) if standby is not None else None
        if proc is None:  # the first start, or a standby that died: one started now, handed at once
            proc = Standby(self.standby_command).start(self.serving_command)
        assert proc is not None, "a standby just started cannot have ended its stdin"
        return proc

    def _wait(self, serving: subprocess.Popen[bytes], poll_s: float) -> int:
        """Wait for `serving` to end, starting the standby STANDBY_DELAY_S after it listens (not while
        it imports on the same cores) and again if the standby ends."""
        due: float | None = None
        while (rc := serving.poll()) is None:
            if self.standby is not None and self.standby.proc.poll() is not None:
                self.log(f"the standby ended ({self.standby.proc.returncode}); starting another")
                self.standby = None
            if self.standby is None and due is None and (self.port is None or _listening(self.port)):
                due = time.monotonic() + STANDBY_DELAY_S
            if self.standby is None and due is not None and time.monotonic() >= due:
                self.standby = Standby(self.standby_command)
            reap_orphans({serving.pid} | self._standby_pids() | self.own)
            time.sleep(poll_s)
        return rc

    def _standby_pids(self) -> frozenset[int]:
        return frozenset({self.standby.pid}) if self.standby is not None else frozenset()


def _listening(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(0.2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _port_free(port: int) -> bool:
    """Whether nothing listens on `port` (the serving store binds every address)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def standby(argv: list[str]) -> int:
    """`python -m trainer.launcher.rendezvous --standby ARGS`: a service process that imports NVRx and
    torch, then waits for the Keeper's start (trainer/launcher/standby.py), the service's own command
    line with the same ARGS, and serves once the port is free."""
    begin()
    from nvidia_resiliency_ext.fault_tolerance import control_plane, ft_rendezvous_barrier  # noqa: F401

    import trainer.launcher.patches  # noqa: F401

    command = await_start()
    if command[1:] != ["-m", "trainer.launcher.rendezvous", *argv]:
        print(f"trainer.launcher.rendezvous: the standby was handed {command[:4]}", file=sys.stderr)
        return 2
    port = _port(argv)
    if port is not None and not wait_port_free(port, PORT_WAIT_S):
        print(f"trainer.launcher.rendezvous: port {port} still held after {PORT_WAIT_S} s", file=sys.stderr)
    return serve(argv)


def wait_port_free(port: int, wait_s: float) -> bool:
    """Wait up to `wait_s` for nothing to listen on `port` (never serve beside a process that still holds
    it); whether it is free."""
    deadline = time.monotonic() + wait_s
    while not _port_free(port):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.02)
    return True


def _port(argv: Sequence[str]) -> int | None:
    """The port of the service's --rdzv-endpoint in `argv` (None: none given, NVRx refuses it)."""
    endpoint = rdzv_endpoint(list(argv))
    return int(endpoint.rpartition(":")[2]) if endpoint and endpoint.rpartition(":")[2].isdigit() else None


def serve(argv: list[str]) -> int:
    """The serving process: NVRx's control node with the additions of the module doc."""
    from nvidia_resiliency_ext.fault_tolerance import control_plane, ft_rendezvous_barrier

    from trainer.launcher.patches import quick_rendezvous_polls, sticky_group_ranks, sync_before_round_wait

    sticky_group_ranks(ft_rendezvous_barrier)  # survivors keep their group rank (and their snapshots)
    sync_before_round_wait(ft_rendezvous_barrier)
    quick_rendezvous_polls(ft_rendezvous_barrier)  # this process only watches: it must not sleep a second
    stores: list[Any] = []  # keeps the store (its server) alive after NVRx's loop returns
    original = control_plane._create_tcp_store
    after_failure: list[bool] = []

    def create_with_epoch(args: Any, read_timeout: float) -> Any:
        store = original(args, read_timeout)
        store.set(EPOCH_KEY, secrets.token_hex(8))
        if after_failure:
            store.set(FOLLOWS_FAILURE_KEY, "1")
        stores.append(store)
        return store

    signalled: list[bool] = []
    original_loop = control_plane._run_control_rendezvous_loop

    def loop_noting_signal(args: Any, ft_cfg: Any, store: Any, services: Any, stop_event: Any) -> None:
        original_loop(args, ft_cfg, store, services, stop_event)
        signalled.append(stop_event.is_set())  # NVRx's SIGTERM/SIGINT handler sets it

    control_plane._create_tcp_store = create_with_epoch
    control_plane._run_control_rendezvous_loop = loop_noting_signal
    args = control_plane.parse_args(argv)
    while True:
        try:
            # Returns on SIGTERM/SIGINT or once the launchers shut the rendezvous down.
            control_plane.run(args)
        except Exception as exc:  # NVRx's own main logs and exits 1 the same way
            print(f"trainer.launcher.rendezvous: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            return 1
        if not stores or not signalled or signalled[-1]:
            return 0 if stores else 1
        reason = shutdown_reason(stores[-1], args.rdzv_id)
        if reason not in RESTARTED_AFTER:
            break
        # NVRx's run() has held the closed store for its read grace (every launcher read the reason);
        # the re-created pods join a new one. Dropping the last reference stops its server.
        print(
            f"trainer.launcher.rendezvous: rendezvous {args.rdzv_id} closed ({reason}); serving a fresh one "
            "for the pods the Job controller re-creates",
            flush=True,
        )
        after_failure.append(True)
        stores.clear()
    stop = threading.Event()
    print(
        f"trainer.launcher.rendezvous: rendezvous {args.rdzv_id} shut down; serving its store until SIGTERM",
        flush=True,
    )
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
