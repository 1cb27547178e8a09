"""`python -m trainer.launcher.ft FT_LAUNCHER [ARG...]`: NVRx's ft_launcher, in this process, with the
launcher patches of trainer/launcher/patches.py:

* `skip_idle_group_grace`: no 1 s sleep after stopping a worker group that has already exited;
* `sync_before_round_wait`: no 1 s sleep in the rendezvous' Step 0 before joining a round that is
  already open (both: docs/nvrx-restart-sleeps.md);
* `no_exit_grace_alone`: a launcher that hosts the store of a one-node job exits without NVRx's 3 s wait
  for other nodes to read it (there are none: every local run of the pod command);
* `quick_rendezvous_polls`: a launcher waiting for a round to open (a hot spare, all the while the job
  trains) looks every `launcher_poll_s` (50 ms in a small job, NVRx's 1 s at 2,000 nodes), so a node
  loss's new round closes as soon as the spare can join it;
* `beat_after_rendezvous`: this node's liveness beat (trainer/launcher/beat.py) in the rendezvous
  store while it is an active node, so that the workers of a starting group notice a node of their
  round that was lost before its workers came (a hot spare killed while it joins) within their
  liveness timeout instead of the barrier timeout. The workers find the store through
  TRAINER_LIVENESS_STORE, set here from `--rdzv-endpoint` before NVRx starts any of them;
* a launcher that reaches a rendezvous closed with a failure (a pod re-created within the service's read
  grace) waits for the fresh one before it joins (supervise.py `wait_past_failed_rendezvous`).

The pod's wrapper (`python -m trainer.launcher`, trainer/launcher/__main__.py) execs this instead of the
`ft_launcher` script it was given (Contract 2). FT_LAUNCHER stays in the process's command line, so the
launcher and the rank monitors it forks are still found as "ft_launcher" processes; argv[0] becomes it,
and NVRx's own `main` parses the rest exactly as the script would.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import uuid


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m trainer.launcher.ft FT_LAUNCHER [ARG...]", file=sys.stderr)
        return 2
    from nvidia_resiliency_ext.fault_tolerance import ft_rendezvous_barrier, launcher

    from trainer.launcher.beat import LauncherBeat, launcher_option, rdzv_endpoint
    from trainer.launcher.patches import (
        beat_after_rendezvous,
        claim_previous_rank,
        launcher_poll_s,
        max_nodes,
        no_exit_grace_alone,
        quick_rendezvous_polls,
        skip_idle_group_grace,
        sticky_group_ranks,
        sync_before_round_wait,
    )
    from trainer.launcher.supervise import (
        CLAIM_FILE_ENV,
        EPOCH_FILE_ENV,
        LAUNCHER_ID_ENV,
        record_service_after_failure,
        wait_past_failed_rendezvous,
        write_epoch_when_reachable,
    )
    from trainer.resilience.liveness import LIVENESS_STORE_ENV, parse_endpoint

    skip_idle_group_grace(launcher)
    no_exit_grace_alone(launcher, max_nodes(argv[1:]))
    sync_before_round_wait(ft_rendezvous_barrier)
    # A standby spare looks for the next round every 50 ms in a small job (NVRx: 1 s), scaled to NVRx's
    # own 1 s at 2,000 nodes.
    quick_rendezvous_polls(ft_rendezvous_barrier, launcher_poll_s(max_nodes(argv[1:])))
    sticky_group_ranks(ft_rendezvous_barrier)  # when this launcher hosts the store (no rendezvous service)
    claim_previous_rank(ft_rendezvous_barrier, os.environ.get(CLAIM_FILE_ENV))  # for a replaced service
    # This launcher process, for its workers: a round is (launcher, TORCHELASTIC_RESTART_COUNT), since the
    # count starts at 0 again in a launcher started anew (trainer/runtime/faults.py's per-node markers).
    os.environ[LAUNCHER_ID_ENV] = uuid.uuid4().hex
    endpoint = rdzv_endpoint(argv[1:])
    try:
        if endpoint:
            parse_endpoint(endpoint, "--rdzv-endpoint")
    except ValueError as exc:  # e.g. a host without a port, which NVRx completes itself: no beats
        print(f"trainer.launcher.ft: node liveness off: {exc}", file=sys.stderr)
        endpoint = None
    if endpoint and beat_after_rendezvous(launcher, LauncherBeat(endpoint)):
        os.environ[LIVENESS_STORE_ENV] = endpoint
    run_id = launcher_option(argv[1:], "--rdzv-id", "--rdzv_id")
    if endpoint and run_id and wait_past_failed_rendezvous(endpoint, run_id):
        print("trainer.launcher.ft: the rendezvous reached had closed with a failure; joined the fresh one")
    epoch_file = os.environ.get(EPOCH_FILE_ENV)
    if endpoint and epoch_file:  # for the supervisor: which rendezvous service this launcher joined
        threading.Thread(target=write_epoch_when_reachable, args=(endpoint, epoch_file), daemon=True).start()
    sys.argv = list(argv)
    try:
        launcher.main()  # NVRx's main ends with sys.exit(its exit code)
    except SystemExit as done:
        if endpoint and epoch_file and done.code not in (0, None):
            # Whether the service was replaced, asked here where torch is loaded: the supervisor's own
            # check starts an interpreter that imports it, seconds on every failing pod's way out.
            try:
                record_service_after_failure(endpoint, epoch_file)
            except BaseException as exc:  # a signal's exception too: the exit below must still run
                print(f"trainer.launcher.ft: no verdict on the rendezvous service: {exc!r}", file=sys.stderr)
        exit_without_teardown(done.code)
    exit_without_teardown(0)  # pragma: no cover - NVRx's main always exits
    return 0  # pragma: no cover - not reached


def exit_without_teardown(code: object) -> None:
    """End the launcher with NVRx's exit code, skipping the interpreter's teardown.

    A launcher whose agent had logged "exits with exit code = 0" aborted in that teardown ("terminate
    called without an active exception", SIGABRT: a native thread of a store client still running), and
    the pod's supervisor took the signal for a kill from outside and started ft_launcher again: the
    completed run was restored and ended a second time (two `run_end` events; make test on a fresh
    clone, 2026-12-02). Nothing is left to do by then: the workers are gone, logs are flushed here."""
    status = code if isinstance(code, int) else (0 if code is None else 1)
    if not isinstance(code, int | type(None)):
        print(code, file=sys.stderr)  # sys.exit("message"): what the interpreter would have printed
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(status)


def standby(launcher_path: list[str]) -> int:
    """`python -m trainer.launcher.ft --standby FT_LAUNCHER`: the pod's warm standby ft_launcher
    (trainer/launcher/standby.py): import what `main` imports, wait for the supervisor's start (the
    command line it would have started cold: `python -m trainer.launcher.ft FT_LAUNCHER ...`, the same
    FT_LAUNCHER), run it."""
    from trainer.launcher.standby import await_start, begin

    begin()
    # What main imports: torch, torch.distributed.elastic and NVRx's launcher, seconds of every start.
    import nvidia_resiliency_ext.fault_tolerance.ft_rendezvous_barrier
    import nvidia_resiliency_ext.fault_tolerance.launcher  # noqa: F401

    import trainer.launcher.beat
    import trainer.launcher.patches
    import trainer.launcher.supervise
    import trainer.resilience.liveness  # noqa: F401

    command = await_start()
    if len(launcher_path) != 1 or command[1:4] != ["-m", "trainer.launcher.ft", *launcher_path]:
        print(
            f"trainer.launcher.ft: the standby of {launcher_path} was handed {command[:4]}", file=sys.stderr
        )
        return 2
    return main(command[3:])


if __name__ == "__main__":
    from trainer.launcher.standby import STANDBY_FLAG

    sys.exit(standby(sys.argv[2:]) if sys.argv[1:2] == [STANDBY_FLAG] else main(sys.argv[1:]))
