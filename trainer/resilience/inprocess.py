"""Tier 1: in-process restart with nvidia_resiliency_ext.inprocess.Wrapper, made to work on CPU/gloo.

What this module adds to a plain Wrapper, and why:

* A restart health check that is safe without a GPU. NVRx 0.4.1 uses only the health check we pass;
  NVRx >= 0.5 also appends NVML-based GPU/NVLink checks whenever LOCAL_RANK is set, which fail on a
  CPU host. On CPU we construct the Wrapper with LOCAL_RANK hidden and then pin its chained check to ours.
* An abort that makes recovery independent of the collective timeout. NVRx's default abort only aborts
  NCCL; a gloo peer blocked in a collective stays blocked until the gloo timeout. Measured here: gloo's
  `ProcessGroup.abort()` does not close its sockets, but destroying the group and dropping the last
  reference does, and a blocked peer then fails at once ("Connection closed by peer"). So the training
  function detaches the tracebacks of the exception (and of those chained to it) before tearing its
  session down and re-raising: a frame of `Module._call_impl`'s closure would otherwise keep the FSDP
  model, so its groups, alive while NVRx holds the exception (see `drop_frames` in
  trainer/runtime/failures.py). The abort here destroys every group from the monitor thread as a second line.
* A lost pod recorded at once: NVRx learns of a dead rank from its monitor process, which dies with the
  pod's container, or after the liveness timeout. `LostPodWatch`, part of the abort, probes the next
  pods of the round and records the ranks of one that is gone as terminated within a fraction of a
  second (trainer/resilience/lostpods.py).
* A rank assignment that never shrinks the world. A dead process is tier 2's job: continuing with fewer
  ranks would change the data layout and the sharding, so a terminated rank makes every survivor leave
  the Wrapper (RestartAbort) and ft_launcher restarts all workers.
* A bounded number of in-process restarts per rank (FaultCounter), after which the process exits and
  tier 2 takes over.
* A store that works around an NVRx bug (0.4.1 and 0.7.0; docs/nvrx-bug-initial-ranks.md): the monitor
  process of a rank that sees a peer vanish writes the peer's initial rank into the termination barrier
  as bytes (`b'1'`), after which every survivor's `CallWrapper.shutdown` fails to parse it, never stops
  its (non-daemon) progress watchdog and hangs at exit until the hard timeout. `WrapperStore` turns
  the ranks back into ints; it is inert once NVRx passes ints.
* An initial barrier that does not wait for a node that is gone: `WrapperStore` watches the launchers'
  node beats (trainer/resilience/liveness.py) while it waits, and a node of the round lost before its
  workers came (a hot spare killed while it joins) makes it raise `NodeLost` within the liveness timeout
  instead of the barrier timeout; the worker then leaves to tier 2 like a rank that saw a peer die.

Only APIs present in both NVRx 0.4.1 and 0.7.x are used: Wrapper(store_factory, store_kwargs, abort,
health_check, rank_assignment, the interval/timeout keywords), CallWrapper.ping/iteration, Abort,
HealthCheck, RankAssignment, Compose, FaultCounter, CudaHealthCheck, exception.RestartAbort.
"""

# No `from __future__ import annotations` here: NVRx passes the CallWrapper to the wrapped function by
# matching parameter annotations against the class, and string annotations break that match.

import dataclasses
import gc
import logging
import os
import threading
from collections.abc import Callable
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from nvidia_resiliency_ext import inprocess
from nvidia_resiliency_ext.inprocess import CallWrapper
from nvidia_resiliency_ext.inprocess.abort import Abort
from nvidia_resiliency_ext.inprocess.attribution import Interruption, InterruptionRecord
from nvidia_resiliency_ext.inprocess.exception import RestartAbort
from nvidia_resiliency_ext.inprocess.health_check import CudaHealthCheck, FaultCounter, HealthCheck
from nvidia_resiliency_ext.inprocess.rank_assignment import RankAssignment, RankAssignmentCtx
from nvidia_resiliency_ext.inprocess.state import Mode
from nvidia_resiliency_ext.inprocess.store import PrefixStore, StoreMixin, TCPStore

from trainer.config.errors import UnrecoverableError
from trainer.resilience.liveness import (
    LIVENESS_STORE_ENV,
    NodeLost,
    RoundWatch,
    local_address_towards,
    parse_endpoint,
    presence_key,
    store_client,
)
from trainer.resilience.lostpods import LostPodProbe, RoundLayout
from trainer.resilience.timeouts import Ports, Timeouts
from trainer.resilience.verdict import RepeatGuard

log = logging.getLogger(__name__)

MAX_INPROCESS_RESTARTS = 16
"""Faults one rank may cause in-process before it exits and leaves recovery to ft_launcher."""


def destroy_all_process_groups(collect: bool = True) -> None:
    """Destroy every torch.distributed group, then collect garbage so gloo closes its sockets.

    On GPU, NCCL communicators are aborted first (NVRx's AbortTorchDistributed): destroying a
    communicator with work pending on a dead peer could block. The collection runs only when there was
    something to destroy, unless `collect` forces it: a full collection costs 0.03-0.3 s.
    """
    if not (dist.is_available() and dist.is_initialized()):
        if collect:
            gc.collect()
        return
    try:
        if torch.cuda.is_available():
            inprocess.abort.AbortTorchDistributed()(None)  # aborts NCCL, then destroys every group
        if dist.is_initialized():
            dist.destroy_process_group()
    except Exception as exc:  # already half torn down by the other thread: nothing left to do
        log.debug("destroy_process_group: %s", exc)
    gc.collect()


def release_mesh_groups(mesh: Any) -> None:
    """Make a DeviceMesh forget its process groups, and clear DTensor's per-thread caches.

    DTensor's sharding-propagation and redistribute caches keep DTensorSpecs, and so the mesh, alive
    after the model is gone; the mesh holds its groups in `_pg_registry` (torch >= 2.9). Without this, the
    gloo group outlives its destruction and a blocked peer waits for the collective timeout.
    """
    for m in (mesh, getattr(mesh, "_root_mesh", None)):
        registry = getattr(m, "_pg_registry", None)
        if isinstance(registry, dict):
            registry.clear()
    try:
        from torch.distributed.tensor import DTensor
        from torch.distributed.tensor._redistribute import _gen_transform_infos

        DTensor._op_dispatcher.sharding_propagator.propagate_op_sharding.cache_clear()
        _gen_transform_infos.cache_clear()
    except (ImportError, AttributeError) as exc:  # private APIs: a newer torch may move them
        log.debug("DTensor caches not cleared: %s", exc)


class DestroyGroupsAbort(Abort):
    """Abort run by the Wrapper's monitor thread: destroy all groups (NCCL is aborted first on GPU)."""

    def __call__(self, state: Any) -> Any:
        destroy_all_process_groups(collect=False)
        return state


ITERATION_SETTLED_KEY = (
    f"{StoreMixin.BARRIER_PREFIX}:reentrant_barrier:{StoreMixin.ITERATION_BARRIER}:last_worker_arrived"
)
"""Set in an iteration's store once every rank arrived at (or was recorded terminated in) NVRx's
iteration barrier (`StoreMixin.reentrant_barrier`); tests/trainer/resilience/test_lostpods.py checks it
against NVRx's own barrier."""


def record_lost_ranks(store: Any, base_store: Any, ranks: list[int], world_size: int) -> None:
    """Record `ranks` terminated as NVRx's monitors record a dead rank (SiblingMonitor's
    `terminate_unresponsive_ranks`): interrupted, terminated, arrived at the iteration barrier of
    `store` (an iteration's PrefixStore) and at the termination barrier of `base_store`. A rank's
    initial rank is its rank: FixedWorld never renumbers."""
    store.record_interrupted([InterruptionRecord(r, Interruption.TERMINATED) for r in ranks])
    store.record_terminated_ranks(ranks)
    store.iteration_barrier(ranks=ranks, rendezvous_count=world_size, timeout=timedelta(0))
    base_store.termination_barrier(ranks=ranks, rendezvous_count=world_size, timeout=timedelta(0))


class LostPodWatch(Abort):
    """Part of the Wrapper's abort, on local rank 0 of each node under trainer.launcher.ft: a thread that
    probes the next pods of the round while the fault is handled and records the ranks of a pod that is
    gone as terminated (trainer/resilience/lostpods.py), so the job leaves for tier 2 at once rather than
    after the liveness timeout. It never delays the abort itself."""

    def __init__(self, layout: RoundLayout, endpoint: str, store_kwargs: dict[str, Any], deadline_s: float):
        self.layout = layout
        self.endpoint = endpoint
        self.store_kwargs = store_kwargs
        self.deadline_s = deadline_s

    @classmethod
    def from_env(
        cls, timeouts: Timeouts, store_kwargs: dict[str, Any], env: Any = None
    ) -> "LostPodWatch | None":
        """The watch for this worker, or None where it does not probe: not local rank 0, not under
        trainer.launcher.ft (no store endpoint), a one-node round, or ranks not laid out as expected."""
        env = os.environ if env is None else env
        endpoint = env.get(LIVENESS_STORE_ENV)
        layout = RoundLayout.from_env(env)
        if not endpoint or layout is None or layout.local_rank != 0 or not layout.probed_nodes():
            return None
        # Past the liveness timeout NVRx's own monitors have decided: probing longer changes nothing.
        return cls(layout, endpoint, store_kwargs, timeouts.liveness_timeout + timeouts.heartbeat_interval)

    def __call__(self, state: Any) -> Any:
        threading.Thread(
            target=self.watch, args=(state.iteration, state.world_size), name="trainer-lost-pods", daemon=True
        ).start()
        return state

    def watch(self, iteration: int, world_size: int) -> list[int]:
        """Probe until the iteration settles; the group ranks of the pods found gone."""
        try:
            rendezvous = store_client(self.endpoint)
            base = LauncherWrapperStore(**self.store_kwargs)
            store = PrefixStore(iteration, base)

            def address(group_rank: int) -> str | None:
                key = presence_key(self.layout.cycle, group_rank)
                return bytes(rendezvous.get(key)).decode() if rendezvous.check([key]) else None

            return LostPodProbe(
                layout=self.layout,
                own_host=local_address_towards(self.endpoint),
                address=address,
                record=lambda ranks: record_lost_ranks(store, base, ranks, world_size),
                settled=lambda: bool(store.check([ITERATION_SETTLED_KEY])),
                deadline_s=self.deadline_s,
            ).run()
        except Exception as exc:  # the store is gone too: the liveness timeout decides, as without this
            log.warning("lost-pod probe stopped: %s", exc)
            return []


class CpuSafeHealthCheck(HealthCheck):
    """CUDA context check when a GPU is in use; on CPU only checks that torch still computes."""

    def __init__(self) -> None:
        self._cuda = CudaHealthCheck()

    def __call__(self, state: Any) -> Any:
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            return self._cuda(state)
        if int(torch.ones(4).sum().item()) != 4:
            raise RuntimeError("torch CPU sanity check failed")
        return state


LIVENESS_POLL_S = 1.0
"""How often a worker in the initial barrier looks at its round's node beats (trainer/resilience/liveness)."""


class _WrapperBarriers:
    """The two changes both Wrapper stores make to NVRx's store (see WrapperStore); a mixin in front of
    NVRx's `StoreMixin` so that `super()` reaches NVRx's barriers and torch's `wait`."""

    liveness_timeout: float | None
    round_watch: RoundWatch | None

    def termination_barrier(self, ranks: Any, *args: Any, **kwargs: Any) -> Any:
        return super().termination_barrier([int(r) for r in ranks], *args, **kwargs)  # type: ignore[misc]

    def initial_barrier(self, *args: Any, **kwargs: Any) -> Any:
        watch = RoundWatch.from_env(self.liveness_timeout) if self.liveness_timeout else None
        if watch is None:
            return super().initial_barrier(*args, **kwargs)  # type: ignore[misc]
        watch.check()  # the clock of a node that has not beaten yet starts here
        kwargs["timeout_chunk"] = timedelta(seconds=LIVENESS_POLL_S)
        self.round_watch = watch
        try:
            return super().initial_barrier(*args, **kwargs)  # type: ignore[misc]
        finally:
            self.round_watch = None

    def wait(self, keys: Any, *args: Any) -> Any:
        """NVRx's barriers wait through this; in the initial barrier a chunk that timed out looks at the
        round's beats before NVRx waits again."""
        try:
            return super().wait(keys, *args)  # type: ignore[misc]
        except torch.distributed.DistStoreError:
            if self.round_watch is not None:
                self.round_watch.check()
            raise


class WrapperStore(_WrapperBarriers, TCPStore):
    """NVRx's TCPStore, hosted by global rank 0, with two changes, for the worker's Wrapper and its
    monitor process alike (NVRx builds both from the Wrapper's store_factory). Used only where no launcher
    store is known (TRAINER_LIVENESS_STORE unset: torchrun, the plain ft_launcher script); otherwise
    `LauncherWrapperStore`, which does not die with rank 0's node.

    * The termination barrier takes ranks as ints even when NVRx passes bytes:
      `SiblingMonitor.terminate_unresponsive_ranks` passes `store.get_initial_ranks(...)`, raw
      `multi_get` values (bytes), to `termination_barrier`, which appends `str(rank)` ("b'1'") to the
      barrier's list; every later reader's `int()` of that list raises. So the bad entry is never written.
    * The initial barrier gives up as soon as a node of this rendezvous round stops beating
      (trainer/resilience/liveness.py: `RoundWatch`, raising `NodeLost`) instead of waiting the whole
      barrier timeout for ranks that will never come: it waits in LIVENESS_POLL_S chunks (NVRx's own
      `timeout_chunk`) and looks at the beats after each. Without a launcher that beats
      (TRAINER_LIVENESS_STORE unset) it is NVRx's barrier unchanged.
    """

    def __init__(self, liveness_timeout: float | None = None, **kwargs: Any) -> None:
        # The host does not wait in the constructor for every rank to connect: NVRx's initial barrier
        # right after waits for them anyway, bounded by the barrier timeout. Waiting here too, when a
        # peer never comes (a spare lost while it joins), cost a barrier timeout, then NVRx retried as a
        # client for two more (three barrier timeouts instead of one).
        kwargs.setdefault("wait_for_workers", False)
        super().__init__(**kwargs)
        self.liveness_timeout = liveness_timeout
        self.round_watch = None


class LauncherWrapperStore(_WrapperBarriers, torch.distributed.PrefixStore, StoreMixin):
    """The Wrapper's store in the launchers' rendezvous store (the rendezvous service's,
    trainer/launcher/rendezvous.py), under a namespace of this job's rendezvous round: no rank hosts it,
    so losing the node of global rank 0 leaves the survivors a store to agree through, and they leave to
    tier 2 within the liveness timeout instead of waiting for their launcher's heartbeat timeout on a
    dead host. The namespace holds the round (TORCHELASTIC_RESTART_COUNT) because each
    round's workers count their in-process iterations from 0 again. NVRx then treats no rank as critical
    (`critical_ranks` is empty), so no rank waits at exit for the others to leave the store."""

    def __init__(
        self, endpoint: str, namespace: str, timeout: timedelta, liveness_timeout: float | None = None
    ) -> None:
        host, port = parse_endpoint(endpoint)
        client = torch.distributed.TCPStore(
            host, port, is_master=False, timeout=timeout, wait_for_workers=False
        )
        torch.distributed.PrefixStore.__init__(self, namespace, client)
        self.liveness_timeout = liveness_timeout
        self.round_watch = None


def wrapper_store(timeouts: Timeouts, ports: Ports, env: Any = None) -> tuple[type, dict[str, Any]]:
    """(store_factory, store_kwargs) for the Wrapper: the launchers' store when the launcher exported it
    (TRAINER_LIVENESS_STORE, trainer/launcher/ft.py), else a store hosted by global rank 0."""
    env = os.environ if env is None else env
    barrier_timeout = timeouts.wrapper_kwargs()["barrier_timeout"]
    endpoint = env.get(LIVENESS_STORE_ENV)
    if endpoint:
        run_id = env.get("TORCHELASTIC_RUN_ID", "local")
        round_ = env.get("TORCHELASTIC_RESTART_COUNT", "0")
        return LauncherWrapperStore, {
            "endpoint": endpoint,
            "namespace": f"trainer/inprocess/{run_id}/{round_}",
            "timeout": barrier_timeout,
            "liveness_timeout": timeouts.liveness_timeout,
        }
    return WrapperStore, {
        "host_name": ports.host,
        "port": ports.inprocess_port,
        "timeout": barrier_timeout,
        "liveness_timeout": timeouts.liveness_timeout,
    }


class LeaveToTier2(RestartAbort):
    """A rank was terminated: this process leaves the Wrapper so that ft_launcher restarts all workers."""


def left_for_tier2(exc: BaseException) -> "LeaveToTier2 | NodeLost | None":
    """The LeaveToTier2 that made the Wrapper return (or the NodeLost that stopped its start), also when
    NVRx chained another error onto it."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, (LeaveToTier2, NodeLost)):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


class GiveUp(RestartAbort):
    """Leave the Wrapper without another iteration (RestartAbort is NVRx's "do not restart"): the
    wrapped function raised an UnrecoverableError, or the same fault repeated (RepeatGuard).

    `error` keeps the UnrecoverableError itself: NVRx may re-raise this exception without its
    `__cause__`, and the exit status (93, and the record that stops relaunches) depends on finding it."""

    def __init__(self, message: str, error: BaseException | None = None) -> None:
        super().__init__(message)
        self.error = error


class FixedWorld(RankAssignment):
    """Keep every rank active with its rank; leave the Wrapper if any rank was terminated (tier 2)."""

    def __call__(self, ctx: RankAssignmentCtx) -> RankAssignmentCtx:
        if ctx.terminated_ranks:
            raise LeaveToTier2(f"ranks {sorted(ctx.terminated_ranks)} terminated: leaving recovery to tier 2")
        ctx.state = dataclasses.replace(
            ctx.state,
            mode=Mode.ACTIVE,
            active_rank=ctx.state.rank,
            active_world_size=ctx.state.world_size,
        )
        return ctx


@contextmanager
def _without_local_rank_on_cpu():
    """Hide LOCAL_RANK while NVRx >= 0.5 builds its chained NVML health checks on a CPU-only host."""
    saved = os.environ.get("LOCAL_RANK")
    hide = saved is not None and not torch.cuda.is_available()
    if hide:
        del os.environ["LOCAL_RANK"]
    try:
        yield
    finally:
        if hide and saved is not None:
            os.environ["LOCAL_RANK"] = saved


def make_wrapper(timeouts: Timeouts, ports: Ports) -> inprocess.Wrapper:
    """A Wrapper configured from the one place that holds timeouts and ports."""
    health = inprocess.Compose(CpuSafeHealthCheck(), FaultCounter(max_rank_faults=MAX_INPROCESS_RESTARTS))
    factory, store_kwargs = wrapper_store(timeouts, ports)
    abort: Abort = DestroyGroupsAbort()
    lost_pods = LostPodWatch.from_env(timeouts, store_kwargs) if factory is LauncherWrapperStore else None
    if lost_pods is not None:
        abort = inprocess.Compose(lost_pods, abort)  # the groups are destroyed first, then the probe starts
    with _without_local_rank_on_cpu():
        wrapper = inprocess.Wrapper(
            store_factory=factory,
            store_kwargs=store_kwargs,
            abort=abort,
            health_check=health,
            rank_assignment=FixedWorld(),
            **timeouts.wrapper_kwargs(),
        )
    if hasattr(wrapper, "restart_health_check") and not torch.cuda.is_available():
        wrapper.restart_health_check = health  # NVRx >= 0.5: only our CPU-safe checks after a fault
    return wrapper


def run_inprocess(
    fn: Callable[[Any], Any],
    timeouts: Timeouts,
    ports: Ports,
    guard: RepeatGuard | None = None,
    failed_at: Callable[[], int] = lambda: -1,
) -> Any:
    """Run `fn(call_wrapper)` under the Wrapper; it is re-run in the same process after a fault.

    `fn` receives the active CallWrapper (for `.iteration` and `.ping()`), and must build its process
    group, model and optimizer afresh on every call and tear them down before an exception leaves it.
    An UnrecoverableError, or a fault that `guard` sees repeat at the same step (`failed_at()`), leaves
    the Wrapper as GiveUp (its __cause__ is the error) instead of starting another iteration.
    """

    def entry(call_wrapper: CallWrapper = None):  # the Wrapper fills it in by this annotation
        try:
            return fn(call_wrapper)
        except UnrecoverableError as exc:
            raise GiveUp(str(exc), error=exc) from exc
        except Exception as exc:  # RankShouldRestart (a peer's fault) is a BaseException: not counted
            if guard is not None and guard.repeated(exc, failed_at()):
                raise GiveUp(guard.describe()) from exc
            raise

    return make_wrapper(timeouts, ports)(entry)()
