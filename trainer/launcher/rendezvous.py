"""`python -m trainer.launcher.rendezvous NVRX_CONTROL_ARGS...`: the job's rendezvous service.

The launchers' rendezvous store (a c10d TCPStore) and the closing of NVRx's barrier rounds used to live in
pod 0's ft_launcher: losing pod 0 took the store with it, every other launcher exited 1 and the Job
controller replaced every pod (docs/failure-domains.md). This process holds them instead, in a pod of
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
  empty store nobody joins. SIGTERM ends it.
"""

from __future__ import annotations

import secrets
import signal
import sys
import threading
from typing import Any

EPOCH_KEY = "trainer/rendezvous/epoch"
"""Key of the service's epoch in its store (a fresh random hex string per service process)."""


def main(argv: list[str]) -> int:
    from nvidia_resiliency_ext.fault_tolerance import control_plane, ft_rendezvous_barrier

    from trainer.launcher.patches import quick_rendezvous_polls, sticky_group_ranks, sync_before_round_wait

    sticky_group_ranks(ft_rendezvous_barrier)  # survivors keep their group rank (and their snapshots)
    sync_before_round_wait(ft_rendezvous_barrier)
    quick_rendezvous_polls(ft_rendezvous_barrier)  # this process only watches: it must not sleep a second
    epoch = secrets.token_hex(8)
    stores: list[Any] = []  # keeps the store (its server) alive after NVRx's loop returns
    original = control_plane._create_tcp_store

    def create_with_epoch(args: Any, read_timeout: float) -> Any:
        store = original(args, read_timeout)
        store.set(EPOCH_KEY, epoch)
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
    try:
        control_plane.run(args)  # returns on SIGTERM/SIGINT or once the launchers shut the rendezvous down
    except Exception as exc:  # NVRx's own main logs and exits 1 the same way
        print(f"trainer.launcher.rendezvous: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return 1
    if not stores or not signalled or signalled[0]:
        return 0 if stores else 1
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
