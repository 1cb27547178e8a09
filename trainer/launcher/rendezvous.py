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
  by the Job's limits.
"""

from __future__ import annotations

import secrets
import signal
import sys
import threading
from typing import Any

EPOCH_KEY = "trainer/rendezvous/epoch"
"""Key of the service's epoch in its store (a fresh random hex string per store)."""
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
