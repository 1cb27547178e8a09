"""The NVRx launcher patches (`nvidia_resiliency_ext.fault_tolerance`: the launcher module and the barrier
rendezvous), applied by trainer/launcher/ft.py before NVRx's `main` runs. Each returns whether the
installed NVRx has what it wraps (False: nothing patched, that part runs as NVRx ships it), and each
names its upstream report and the canary test that fails once NVRx no longer needs it:

* `skip_idle_group_grace` (launcher.terminate_mp_processes) and `sync_before_round_wait`
  (ft_rendezvous_barrier._RendezvousBarrierState): docs/nvrx-restart-sleeps.md; canaries
  tests/trainer/launcher/test_patches.py::test_nvrx_terminate_as_shipped_sleeps_with_no_group_left and
  ::test_nvrx_step_0_as_shipped_sleeps_a_second_first.
* `beat_after_rendezvous` (launcher.LocalElasticAgent._rendezvous): docs/nvrx-no-liveness-after-round.md;
  canary tests/trainer/launcher/test_patches.py::test_nvrx_barrier_rendezvous_still_has_no_liveness.
* `sticky_group_ranks` (ft_rendezvous_barrier._RendezvousBarrierState._assign_group_ranks, on the store
  host: the rendezvous service, trainer/launcher/rendezvous.py): docs/nvrx-group-rank-shift.md; canary
  tests/trainer/launcher/test_sticky_ranks.py::test_nvrx_assignment_as_shipped_moves_survivors_down.
* `claim_previous_rank` (ft_rendezvous_barrier._RendezvousBarrierState.perform_rendezvous, on every
  launcher) with the claims `sticky_group_ranks` reads: a replaced rendezvous service ranks the pods as
  the old one did (docs/nvrx-group-rank-shift.md); NVRx keeps no such memory by design (its host is a
  training node), so the test is tests/trainer/launcher/test_sticky_ranks.py::test_a_new_host_honours_claims.
* `no_exit_grace_alone` (launcher.launch_agent's store-host grace, the launcher module's `time.sleep` in
  its `_wait_grace` thread, only in a job of one node): docs/nvrx-restart-sleeps.md; canary
  tests/trainer/launcher/test_patches.py::test_nvrx_store_host_as_shipped_waits_3_s_at_exit.
* `quick_rendezvous_polls` (the barrier module's `time.sleep` and `_compute_step2_poll_interval`, in the
  rendezvous service, and with a poll scaled by the job size in every launcher):
  docs/nvrx-restart-sleeps.md; canary
  tests/trainer/launcher/test_rendezvous_polls.py::test_nvrx_host_polls_as_shipped_wait_a_second.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable
from typing import Any

from trainer.launcher.podfiles import read_claim, write_claim

# ------------------------------------------------------------------ launcher: stopping a worker group
# NVRx 0.7's launcher, stopping a worker group before each restart round, calls
# `fault_tolerance.utils.terminate_mp_processes(pgids)`: SIGTERM to every worker process group, then a
# fixed 1.0 s sleep, then SIGKILL. It sleeps even when every group is already gone (the usual case: the
# workers exited or were reaped before): 1 s of every tier-2 recovery (docs/nvrx-restart-sleeps.md).
# `skip_idle_group_grace` runs it only when a group is left.


def _process_group_exists(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, another user's: let NVRx decide
        return True
    return True


def skip_idle_group_grace(launcher_module: Any) -> bool:
    """Wrap the launcher module's `terminate_mp_processes` so that it returns at once when none of the
    worker process groups exists any more; otherwise NVRx's own (SIGTERM, 1 s, SIGKILL). Returns whether
    the installed NVRx has the function (False: nothing patched, the launcher runs as shipped)."""
    original = getattr(launcher_module, "terminate_mp_processes", None)
    if original is None or getattr(original, "_skips_idle_grace", False):
        return original is not None

    @functools.wraps(original)
    def terminate_if_any_left(allowed_pgids: Any) -> Any:
        if not any(_process_group_exists(int(g)) for g in allowed_pgids):
            return None
        return original(allowed_pgids)

    terminate_if_any_left._skips_idle_grace = True  # type: ignore[attr-defined]
    launcher_module.terminate_mp_processes = terminate_if_any_left
    return True


# ------------------------------------------------------------------ launcher: the agent's rendezvous step
# NVRx 0.7's barrier rendezvous sends no keep-alives once a round is closed, so a node lost between the
# round's close and its workers' start is noticed only after the Wrapper's barrier timeout
# (docs/nvrx-no-liveness-after-round.md). The beat tells the workers which nodes still have a launcher.


def beat_after_rendezvous(launcher_module: Any, beat: Any) -> bool:
    """Wrap the launcher agent's `_rendezvous` so that `beat` (trainer/launcher/beat.py:
    LauncherBeat) pauses while this node is in a rendezvous and serves (cycle, group rank) once a round
    made it active; a hot spare stays inside NVRx's rendezvous until then. Returns whether the installed
    NVRx has the agent method (False: nothing patched, no beats, workers wait as NVRx ships it)."""
    agent: Any = getattr(launcher_module, "LocalElasticAgent", None)
    original = getattr(agent, "_rendezvous", None)
    if original is None or getattr(original, "_beats", False):
        return original is not None

    @functools.wraps(original)
    def rendezvous_then_beat(self: Any, worker_group: Any) -> Any:
        beat.pause()
        result = original(self, worker_group)
        beat.serve(int(self._rdzv_handler.round()), int(worker_group.group_rank))
        return result

    rendezvous_then_beat._beats = True  # type: ignore[attr-defined]
    agent._rendezvous = rendezvous_then_beat
    return True


# ------------------------------------------------------------------ barrier rendezvous: Step 0
# NVRx 0.7's `_wait_for_rendezvous_open` sleeps 1 s before it looks at a round it has just caught up
# with (docs/nvrx-restart-sleeps.md).


def sync_before_round_wait(barrier_module: Any) -> bool:
    """Wrap the barrier rendezvous' Step 0 (`_RendezvousBarrierState._wait_for_rendezvous_open`) so that
    it first catches up with the rounds opened since this node's last one, then waits as NVRx does.

    NVRx's loop does that catch-up itself on its first pass, but only after it has found its old round
    closed, and then sleeps 1 s before it looks at the round it just caught up with: every launcher that
    restarts its workers lost a second there (docs/nvrx-restart-sleeps.md). Catching up first is what
    the loop's first pass does anyway (`perform_rendezvous` resets the rate limit before Step 0), so only
    the order changes. Returns whether the installed NVRx has both methods (False: nothing patched)."""
    state: Any = getattr(barrier_module, "_RendezvousBarrierState", None)
    original = getattr(state, "_wait_for_rendezvous_open", None)
    if original is None or not callable(getattr(state, "_sync_from_per_round_state", None)):
        return False
    if getattr(original, "_syncs_first", False):
        return True

    @functools.wraps(original)
    def sync_then_wait(self: Any, *args: Any, **kwargs: Any) -> Any:
        self._sync_from_per_round_state()
        return original(self, *args, **kwargs)

    sync_then_wait._syncs_first = True  # type: ignore[attr-defined]
    state._wait_for_rendezvous_open = sync_then_wait
    return True


# ------------------------------------------------------------------ barrier rendezvous: group ranks
# NVRx 0.7's store host assigns a round's group ranks 0..world-1 to the active candidates in
# infrastructure-rank order, compacted: when node k is lost, every survivor above k moves down one rank
# and the spare goes last. A survivor's /dev/shm snapshots are of its old ranks, so after a loss below
# it they are another rank's state, and the group fell back to the durable checkpoint (seen: losing
# pod 0 restored step 31 from FSx, 5 steps recomputed, instead of step 35 from memory and the peer).
# Upstream report: docs/nvrx-group-rank-shift.md.


def sticky_group_ranks(barrier_module: Any) -> bool:
    """Wrap the store host's `_RendezvousBarrierState._assign_group_ranks` so that a node active in the
    previous round it closed keeps its group rank. A node is its infrastructure rank when it has one
    (so a launcher started again on its pod is the same node), else its launcher's descriptor. The
    ranks left free go to the other candidates in NVRx's own order, and the rest stand by as NVRx
    ranks them. Segment-aware rounds (`segment` set: whole NVLink domains) keep NVRx's assignment.
    Returns whether the installed NVRx has the method (False: nothing patched)."""
    state: Any = getattr(barrier_module, "_RendezvousBarrierState", None)
    original = getattr(state, "_assign_group_ranks", None)
    if original is None:
        return False
    if getattr(original, "_sticky", False):
        return True

    @functools.wraps(original)
    def assign_keeping_survivors(self: Any, active: Any, world_size: int, *args: Any, **kwargs: Any) -> Any:
        assigned = original(self, active, world_size, *args, **kwargs)
        # A node is its infrastructure rank when it has one (GROUP_RANK, SLURM_PROCID: the same for a
        # launcher started again on the same pod), else its descriptor (this launcher process).
        identity = {p[0]: (p[1] if isinstance(p[1], int) and p[1] >= 0 else p[0]) for p in active}
        by_identity = {identity.get(node, node): rank for node, rank in assigned.items()}
        if getattr(self, "segment", None) is None:
            previous = dict(getattr(self, "_trainer_previous_ranks", {}))
            # What this process remembers wins; a node it has no memory of (every node, when the
            # service was replaced; a launcher started again on its pod under a new descriptor) may
            # claim the rank its pod's launcher last held.
            present = {identity.get(p[0], p[0]) for p in active}
            taken = {rank for who, rank in previous.items() if who in present}
            for node, rank in read_claims(getattr(self, "store", None), [p[0] for p in active]).items():
                who = identity.get(node, node)
                if who not in previous and rank not in taken:
                    previous[who] = rank
                    taken.add(rank)
            by_identity = keep_previous_ranks(by_identity, previous, world_size)
            assigned = {node: by_identity[identity.get(node, node)] for node in assigned}
        self._trainer_previous_ranks = {who: rank for who, rank in by_identity.items() if rank < world_size}
        return assigned

    assign_keeping_survivors._sticky = True  # type: ignore[attr-defined]
    state._assign_group_ranks = assign_keeping_survivors
    return True


# ------------------------------------------------------------------ barrier rendezvous: a pod's claim
# The memory of sticky_group_ranks lives in the process that hosts the store. When that process is
# replaced (the rendezvous service's pod deleted or its node drained), the new one remembers nothing and
# NVRx ranks the nodes afresh, by infrastructure rank or arrival: seen, a replacement pod with an empty
# /dev/shm took rank 0 while the pod that held rank 0's snapshots stood by, and the job started over from
# its durable checkpoint. So each pod's launcher remembers its own last group rank (in a file its
# supervisor keeps, trainer/launcher/supervise.py) and offers it as a claim before it joins a round; the
# host honours claims only for nodes it has no memory of and only for ranks nobody else holds. A claim
# moves no data: a wrong one (a stale file) costs a restore from peers or the durable checkpoint, never
# a wrong resume (the restore agreement, trainer/recovery/restore.py, decides what is loaded).

CLAIM_PREFIX = "trainer/rendezvous/claim/"
"""Store key prefix of a joining node's claim: `<prefix><node descriptor>` = its pod's last group rank,
or -1 for none."""


def read_claims(store: Any, nodes: list[Any]) -> dict[Any, int]:
    """node -> claimed rank for the nodes that wrote a claim (>= 0) into `store`; {} when there is no
    store. One round trip when every node wrote one (every launcher of the job does, before it joins)."""
    if store is None or not nodes:
        return {}
    keys = [f"{CLAIM_PREFIX}{node!r}" for node in nodes]
    try:
        if store.check(keys):
            values = list(store.multi_get(keys))
        else:
            values = [store.get(k) if store.check([k]) else b"-1" for k in keys]
    except Exception:  # the store's own failure surfaces in NVRx's next call; a claim is only a hint
        return {}
    claims: dict[Any, int] = {}
    for node, raw in zip(nodes, values, strict=True):
        try:
            rank = int(bytes(raw).decode())
        except ValueError:
            continue
        if rank >= 0:
            claims[node] = rank
    return claims


def claim_previous_rank(barrier_module: Any, claim_file: str | None) -> bool:
    """Wrap the joining side's `_RendezvousBarrierState.perform_rendezvous`: before each join write this
    pod's claim (its launcher's last group rank, from `claim_file`) under the node's descriptor, and once
    a round made the node active, remember that rank in `claim_file`. Without a claim file (no
    supervisor) nothing is claimed. Returns whether the installed NVRx has the method."""
    state: Any = getattr(barrier_module, "_RendezvousBarrierState", None)
    original = getattr(state, "perform_rendezvous", None)
    if original is None:
        return False
    if getattr(original, "_claims", False):
        return True

    @functools.wraps(original)
    def claim_then_join(self: Any, node_desc: Any, *args: Any, **kwargs: Any) -> Any:
        if claim_file:
            # A store that does not answer fails NVRx's own join next.
            with contextlib.suppress(Exception):
                self.store.set(f"{CLAIM_PREFIX}{node_desc!r}", str(read_claim(claim_file)))
        result = original(self, node_desc, *args, **kwargs)
        write_claim(claim_file, int(result[0]))
        return result

    claim_then_join._claims = True  # type: ignore[attr-defined]
    state.perform_rendezvous = claim_then_join
    return True


def keep_previous_ranks(
    assigned: dict[Any, int], previous: dict[Any, int], world_size: int, candidates: Any = None
) -> dict[Any, int]:
    """`assigned` (node -> group rank, NVRx's: ranks < world_size active, the rest standby) changed so
    that every candidate node (default: every node) that held an active rank in `previous` holds it
    again, even one NVRx put on standby (a survivor a little slower to rejoin than a spare); the free
    active ranks go, in ascending order, to the other candidates in the order NVRx ranked them; the rest
    stand by, in that order. Pure, for the tests."""
    order = sorted(assigned, key=lambda n: assigned[n])
    eligible = set(order if candidates is None else candidates)
    kept = {n: previous[n] for n in order if n in eligible and previous.get(n, world_size) < world_size}
    if len(set(kept.values())) != len(kept):  # cannot happen with one host's memory; be NVRx then
        return assigned
    free = [r for r in range(world_size) if r not in set(kept.values())]
    result: dict[Any, int] = {}
    standby = world_size
    for node in order:
        if node in kept:
            result[node] = kept[node]
        elif node in eligible and free:
            result[node] = free.pop(0)
        else:
            result[node] = standby
            standby += 1
    if free:  # fewer candidates than active ranks: NVRx would not have assigned; keep its answer
        return assigned
    return result


# ------------------------------------------------------------------ barrier rendezvous: the host's polls
# NVRx 0.7's store host looks for a newly opened round once a second (Step 0: `time.sleep(1.0)` between
# checks) and checks a gathering round's participants at most once a second (Step 2:
# `_compute_step2_poll_interval`, 1 s up to min_nodes/2000 s). A launcher that hosts the store never
# waits for the first (it opens the round itself); the rendezvous service, which only watches, lost up to
# a second there and up to another in Step 2 after every failure (docs/nvrx-restart-sleeps.md).

# Every launcher has the same Step 0 wait: a hot spare stands by in it while the job trains, and after a
# node loss the new round closes only once the spare has looked again, so the recovery paid up to one
# more second, depending on the phase of that poll.
# Launchers poll as the service does, scaled by the job's size so that the standbys' looks at the store
# stay bounded (`launcher_poll_s`): at 2,000 nodes a launcher waits NVRx's 1 s again.

HOST_POLL_S = 0.05
"""The rendezvous service's poll while it waits for a round to open or fill (one key, or the round's
slots, per poll)."""


def launcher_poll_s(max_nodes: int | None) -> float:
    """A launcher's poll in the rendezvous for a job of up to `max_nodes` nodes: 50 ms for small jobs,
    max_nodes/2000 s from 100 nodes, NVRx's 1 s from 2,000 (every standby looks at the store at most
    2000/max_nodes times a second, so all of them together at most 2,000 times)."""
    if not max_nodes or max_nodes < 1:
        return 1.0
    return max(HOST_POLL_S, min(1.0, max_nodes / 2000.0))


def max_nodes(argv: list[str]) -> int | None:
    """The largest node count of ft_launcher's `--nnodes` (MIN:MAX or N) in `argv`, if readable."""
    from trainer.launcher.beat import launcher_option

    top = (launcher_option(argv, "--nnodes") or "").rsplit(":", 1)[-1]
    return int(top) if top.isdigit() else None


def quick_rendezvous_polls(barrier_module: Any, poll_s: float = HOST_POLL_S) -> bool:
    """For the rendezvous service (trainer/launcher/rendezvous.py), and for every launcher with its
    `launcher_poll_s` (trainer/launcher/ft.py): NVRx's barrier module
    sleeps at most `poll_s` at a time, and Step 2 checks a round of N nodes every max(poll_s, N/2000) s,
    NVRx's own scaling without its 1 s floor (at 2,000 nodes it is NVRx's 1 s again). Returns whether the
    installed NVRx has what it replaces (False: nothing patched)."""
    state: Any = getattr(barrier_module, "_RendezvousBarrierState", None)
    real_time = getattr(barrier_module, "time", None)
    if state is None or real_time is None or not hasattr(state, "_compute_step2_poll_interval"):
        return False
    if getattr(real_time, "_quick", False):
        return True
    import time as _time

    def sleep(seconds: float) -> None:
        _time.sleep(min(float(seconds), poll_s))

    barrier_module.time = _time_with_sleep(sleep, "_quick")

    def step2_poll_interval(min_nodes: int, segment_check_interval: float) -> float:
        return max(poll_s, min(float(segment_check_interval), min_nodes / 2000.0))

    state._compute_step2_poll_interval = staticmethod(step2_poll_interval)
    return True


# ------------------------------------------------------------------ launcher: the store host's exit
# NVRx 0.7's `launch_agent`, in a launcher that hosts the rendezvous store, waits a fixed 3.0 s before it
# exits (a thread running `_wait_grace`: `time.sleep(grace_period)`), so that other nodes can read the
# store's final state before the store goes with the process. In a job of one node there is nobody else
# to read it: 3 s of every completed or failed single-node run (every local run of the pod command).
# Launchers of a multi-node job (and every pod under the chart, whose store the rendezvous service hosts)
# keep NVRx's wait.

GRACE_THREAD_TARGET = "_wait_grace"


def no_exit_grace_alone(launcher_module: Any, max_nodes: int | None) -> bool:
    """In a job of at most one node, the store host's exit grace returns at once; every other sleep of
    the launcher module is the real one. Returns whether the installed NVRx has the grace (False: nothing
    patched)."""
    import inspect
    import threading
    import time as _time

    launch = getattr(launcher_module, "launch_agent", None)
    real_time = getattr(launcher_module, "time", None)
    if launch is None or real_time is None or max_nodes != 1:
        return False
    if getattr(real_time, "_no_exit_grace", False):
        return True
    try:
        if GRACE_THREAD_TARGET not in inspect.getsource(launch):
            return False
    except (OSError, TypeError):
        return False

    def sleep(seconds: float) -> None:
        # Python names a thread after its target: "Thread-N (_wait_grace)".
        if threading.current_thread().name.endswith(f"({GRACE_THREAD_TARGET})"):
            return
        _time.sleep(seconds)

    launcher_module.time = _time_with_sleep(sleep, "_no_exit_grace")
    return True


def _time_with_sleep(sleep: Callable[[float], None], mark: str) -> Any:
    """A stand-in for a module's `time`: the real module's functions but `sleep`, and `mark` set (how a
    patch finds itself already applied)."""
    import time as _time
    import types

    patched = types.SimpleNamespace(**{n: getattr(_time, n) for n in dir(_time) if not n.startswith("_")})
    patched.sleep = sleep
    setattr(patched, mark, True)
    return patched
