"""Follow one training Job through the Kubernetes API with the official `kubernetes` client: the Job's
state, its pods' phases and container exit codes, the events about them, and the trainer logs.

Used by tools/cluster_smoke.py. One daemon thread per watched kind (Job, pods, events) and one per pod
log feed a single queue; the caller's thread does all the reporting and owns the deadlines, so a quiet
or stuck API never holds the smoke run past its timeout. Exit codes are read once more from a final
pod list when the Job has ended, so a watch event missed at the end cannot hide a failed container.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from kubernetes import client, watch
from kubernetes.client.exceptions import ApiException

from tools.smoke_plan import SmokeError

# Every trainer workload of the blueprint, whatever its release (k8s/templates/_helpers.tpl labels).
TRAINER_SELECTOR = "app.kubernetes.io/part-of=nvrx-eks-blueprint,app.kubernetes.io/component=trainer"
# Exit codes the chart's podFailurePolicy fails the Job on (values.yaml failJobExitCodes).
EXIT_MEANINGS = {
    2: "a usage or configuration error no restart fixes",
    93: "ft_launcher's do-not-restart verdict",
}
WATCH_WINDOW_S = 30  # one watch request's server-side timeout; the thread re-watches from where it was
LOG_DRAIN_S = 10.0
"""How long a followed Job's end waits for its pods' log streams to end (the API server closes a followed
log when the container ends; its last lines may arrive after the Job's completion)."""
_HTTP_GONE = 410


def release_selector(release: str) -> str:
    """The labels of one release's trainer Job and pods."""
    return f"app.kubernetes.io/instance={release},app.kubernetes.io/component=trainer"


def job_state(job: client.V1Job) -> str:
    """`complete`, `failed` or `running`, from the Job's status conditions."""
    for condition in (job.status.conditions if job.status else None) or []:
        if condition.status != "True":
            continue
        if condition.type in ("Complete", "SuccessCriteriaMet"):
            return "complete"
        if condition.type in ("Failed", "FailureTarget"):
            return "failed"
    return "running"


@dataclass(frozen=True)
class ContainerExit:
    """A container of a pod that has terminated, and how."""

    pod: str
    container: str
    exit_code: int
    reason: str
    init: bool

    def describe(self) -> str:
        kind = "init container" if self.init else "container"
        meaning = EXIT_MEANINGS.get(self.exit_code, "")
        why = f": {meaning}" if meaning else ""
        return f"pod {self.pod}: {kind} {self.container} exited {self.exit_code} ({self.reason}){why}"


def container_exits(pod: client.V1Pod) -> list[ContainerExit]:
    """Terminated containers of a pod, init containers first."""
    exits = []
    status = pod.status
    for statuses, init in ((status.init_container_statuses, True), (status.container_statuses, False)):
        for cs in statuses or []:
            terminated = cs.state.terminated if cs.state else None
            if terminated is not None:
                reason = terminated.reason or "Terminated"
                exits.append(ContainerExit(pod.metadata.name, cs.name, terminated.exit_code, reason, init))
    return exits


@dataclass
class JobOutcome:
    """How a followed Job ended."""

    name: str
    state: str
    exits: list[ContainerExit] = field(default_factory=list)

    @property
    def failures(self) -> list[ContainerExit]:
        return [e for e in self.exits if e.exit_code != 0]


class Kube:
    """The smoke run's view of one namespace through the Kubernetes API."""

    def __init__(
        self,
        api: client.ApiClient,
        namespace: str,
        log: Callable[[str], None] = print,
        logs_dir: Path | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api, self.namespace, self.log, self.logs_dir, self.clock = api, namespace, log, logs_dir, clock
        self.batch = client.BatchV1Api(api)
        self.core = client.CoreV1Api(api)
        self._log_threads: list[threading.Thread] = []

    # -- one-shot calls --------------------------------------------------------------------------
    def active_trainer_jobs(self) -> list[str]:
        """Names of unsuspended, unfinished trainer Jobs (of any release) in the namespace."""
        jobs = self.batch.list_namespaced_job(self.namespace, label_selector=TRAINER_SELECTOR).items
        return [
            j.metadata.name for j in jobs if job_state(j) == "running" and not (j.spec and j.spec.suspend)
        ]

    def set_suspended(self, job: str, suspended: bool) -> None:
        self.batch.patch_namespaced_job(job, self.namespace, {"spec": {"suspend": suspended}})

    def release_job(self, release: str, timeout_s: float = 60, poll_s: float = 1) -> str:
        """The name of a release's trainer Job (it carries a digest of its spec, so it is looked up)."""
        deadline = self.clock() + timeout_s
        while True:
            jobs = self.batch.list_namespaced_job(self.namespace, label_selector=release_selector(release))
            names = [j.metadata.name for j in jobs.items]
            if len(names) == 1:
                return names[0]
            if len(names) > 1:
                raise SmokeError(f"release {release} has several trainer Jobs: {sorted(names)}")
            if self.clock() >= deadline:
                raise SmokeError(f"release {release} created no trainer Job within {timeout_s:.0f} s")
            time.sleep(poll_s)

    def pod_log(self, pod: str, container: str) -> str:
        return str(self.core.read_namespaced_pod_log(pod, self.namespace, container=container))

    # -- following a Job -------------------------------------------------------------------------
    def follow(self, job: str, release: str, start_timeout_s: float, timeout_s: float) -> JobOutcome:
        """Report the Job's pods, exits and events until it completes or fails.

        Raises SmokeError when no pod of the Job has started (left Pending) within start_timeout_s,
        naming the last events (e.g. FailedScheduling), or when the Job runs past timeout_s.
        """
        feed: queue.Queue[tuple[str, str, Any]] = queue.Queue()
        stop = threading.Event()
        pods = release_selector(release)
        self._spawn(feed, stop, "job", self.batch.list_namespaced_job, field_selector=f"metadata.name={job}")
        self._spawn(feed, stop, "pod", self.core.list_namespaced_pod, label_selector=pods)
        self._spawn(feed, stop, "event", self.core.list_namespaced_event)
        started_at = self.clock()
        followed_from = datetime.now(UTC) - timedelta(minutes=5)  # older events are an earlier run's
        state, started = "running", False
        phases: dict[str, str] = {}
        exits: dict[tuple[str, str], ContainerExit] = {}
        following: set[str] = set()
        recent_events: deque[str] = deque(maxlen=3)
        try:
            while state == "running":
                waited = self.clock() - started_at
                if not started and waited >= start_timeout_s:
                    pending = ", ".join(f"{p} {ph}" for p, ph in sorted(phases.items())) or "no pods created"
                    events = "; ".join(recent_events) or "none"
                    raise SmokeError(
                        f"job {job}: no pod started within {start_timeout_s:.0f} s ({pending}); "
                        f"last events: {events}"
                    )
                if waited >= timeout_s:
                    raise SmokeError(f"job {job} did not finish within {timeout_s:.0f} s")
                try:
                    kind, event_type, obj = feed.get(timeout=0.2)
                except queue.Empty:
                    continue
                if kind == "error":
                    raise SmokeError(f"watching {event_type} failed: {obj}")
                if kind == "job":
                    state = job_state(obj)
                elif kind == "pod" and event_type != "DELETED":
                    started |= self._on_pod(obj, phases, exits, following, feed)
                elif kind == "log-error":
                    self.log(f"  cannot read the log of {event_type}: {obj}")
                elif kind == "event" and _about(obj, job) and _since(obj, followed_from):
                    line = f"{obj.type} {obj.reason} {obj.involved_object.name}: {obj.message}"
                    recent_events.append(line)
                    self.log(f"  event: {line}")
        finally:
            stop.set()
        # The Job's end can overtake the last pod updates: report them from one final list.
        for pod in self.core.list_namespaced_pod(self.namespace, label_selector=pods).items:
            self._on_pod(pod, phases, exits, following, feed)
        self.finish_logs()
        return JobOutcome(job, state, sorted(exits.values(), key=lambda e: (e.pod, not e.init, e.container)))

    def _on_pod(
        self,
        pod: client.V1Pod,
        phases: dict[str, str],
        exits: dict[tuple[str, str], ContainerExit],
        following: set[str],
        feed: queue.Queue[tuple[str, str, Any]],
    ) -> bool:
        """Report a pod's phase change and new container exits; True once the pod has left Pending."""
        name, phase = pod.metadata.name, (pod.status.phase if pod.status else None) or "Unknown"
        if phases.get(name) != phase:
            phases[name] = phase
            self.log(f"  pod {name}: {phase}")
        for e in container_exits(pod):
            if (e.pod, e.container) not in exits:
                exits[(e.pod, e.container)] = e
                self.log(f"  {e.describe()}")
        # A pod seen only after it ended (a short one, or one that ended before the watch began) has its
        # log read whole, when its trainer container ran at all.
        if (phase == "Running" or _trainer_ran(pod)) and name not in following and self.logs_dir is not None:
            following.add(name)
            self._spawn_log(name, feed)
        return phase not in ("Pending", "Unknown")

    def _spawn(
        self,
        feed: queue.Queue[tuple[str, str, Any]],
        stop: threading.Event,
        kind: str,
        list_fn: Callable[..., Any],
        **selectors: str,
    ) -> None:
        def pump() -> None:
            resource_version: str | None = None
            while not stop.is_set():
                kwargs: dict[str, Any] = {**selectors, "timeout_seconds": WATCH_WINDOW_S}
                if resource_version:
                    kwargs["resource_version"] = resource_version
                try:
                    for event in watch.Watch().stream(list_fn, self.namespace, **kwargs):
                        obj = event["object"]
                        resource_version = obj.metadata.resource_version or resource_version
                        feed.put((kind, event["type"], obj))
                        if stop.is_set():
                            return
                except ApiException as exc:
                    if exc.status == _HTTP_GONE:  # the resource version expired: watch from now on
                        resource_version = None
                        continue
                    feed.put(("error", kind, f"{exc.status} {exc.reason}"))
                    return
                except Exception as exc:  # connection lost: report it; the caller decides
                    feed.put(("error", kind, repr(exc)))
                    return

        threading.Thread(target=pump, name=f"watch-{kind}", daemon=True).start()

    def _spawn_log(self, pod: str, feed: queue.Queue[tuple[str, str, Any]]) -> None:
        """Stream the trainer container's log of one pod into logs_dir/<pod>.log."""
        assert self.logs_dir is not None
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        path = self.logs_dir / f"{pod}.log"
        self.log(f"  logs of {pod} -> {path}")

        def pump() -> None:
            try:
                lines: Iterable[str] = watch.Watch().stream(
                    self.core.read_namespaced_pod_log, pod, self.namespace, container="trainer", follow=True
                )
                # Read until the API server ends the stream (the container ended): stopping when the Job
                # ended dropped the log's last lines, which arrive after the Job's completion under load.
                with path.open("a") as out:
                    for line in lines:
                        out.write(line + "\n")
                        out.flush()
            except Exception as exc:  # a log that cannot be read must not stop the smoke run
                feed.put(("log-error", pod, repr(exc)))

        thread = threading.Thread(target=pump, name=f"log-{pod}", daemon=True)
        thread.start()
        self._log_threads.append(thread)

    def finish_logs(self, timeout_s: float = LOG_DRAIN_S) -> None:
        """Wait (at most `timeout_s` in all) for the pods' log streams to end, so the log files are whole."""
        deadline = time.monotonic() + timeout_s
        for thread in self._log_threads:
            thread.join(max(0.0, deadline - time.monotonic()))


def _trainer_ran(pod: client.V1Pod) -> bool:
    statuses = (pod.status.container_statuses if pod.status else None) or []
    return any(
        s.name == "trainer" and s.state is not None and s.state.terminated is not None for s in statuses
    )


def _about(event: client.CoreV1Event, job: str) -> bool:
    """Whether an event concerns the Job or one of its pods (pod names start with the Job's name)."""
    name = event.involved_object.name if event.involved_object else ""
    return bool(name) and (name == job or name.startswith(f"{job}-"))


def _since(event: client.CoreV1Event, since: datetime) -> bool:
    """Whether an event happened after `since` (an earlier smoke run's Job may have had the same name;
    an event without any timestamp is kept)."""
    when = (
        event.last_timestamp
        or event.event_time
        or (event.metadata.creation_timestamp if event.metadata else None)
    )
    return when is None or when >= since
