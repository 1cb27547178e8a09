"""One pod on one node: its sandbox, its init containers one after another, then its containers as local
process trees (tools/localpod.py: every process of a container is found by an inherited marker and
killed whole), its status reported through the API, its deletion honoured.

A sidecar (an init container with restartPolicy Always) starts in its place among the init containers,
the next one waiting for its exec startup probe; it is stopped once the main containers have ended and
does not decide the pod's phase. restartPolicy: `Never` leaves an exited container terminated;
`OnFailure` restarts one that failed; `Always` restarts it whatever its exit code; an init container is
retried unless the policy is `Never` (then the pod fails). Restarts wait the kubelet's back-off:
`restart_backoff_s`, doubled per restart of the container, at most five minutes. The pod is Succeeded
when every container exited 0 and none will restart, Failed when one did not.

Deletion (a deletionTimestamp): SIGTERM to every container's main process, SIGKILL of every process of
the pod after the grace period (the pod's deletionGracePeriodSeconds), the final status posted, then the
pod deleted with grace 0, as the kubelet confirms a stopped pod.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tools.kubelet.api import KubeletApi
from tools.kubelet.env import EnvError, container_argv, container_env, rewrite_cluster_names
from tools.kubelet.nodes import now_iso
from tools.kubelet.sandbox import MountMap, PodSandbox, VolumeError, mount_map
from tools.kubelet.status import (
    START_ERROR_EXIT,
    ContainerState,
    condition,
    exit_code,
    pod_status,
    running,
    same_status,
    terminated,
    waiting,
)
from tools.localjob import with_rdzv_host
from tools.localpod import LocalPod

log = logging.getLogger("tools.kubelet")
POLL_S = 0.05
MAX_BACKOFF_S = 300.0
HOST_IP = "127.0.0.1"
RDZV_ENDPOINT_FLAGS = ("--rdzv-endpoint=", "--rdzv_endpoint=")
POD_IP = "127.0.0.1"


@dataclass(frozen=True)
class NodeContext:
    """What every pod of a node shares: the API, the node's folders, the image and the DNS stand-in."""

    api: KubeletApi
    node: str
    node_root: Path
    storage_root: Path
    image_env: Mapping[str, str]
    """The image's environment: PATH with this virtualenv, PYTHONPATH, ... (tools/kubelet/image.py)."""
    workdir: Path
    """The image's working directory (a container without workingDir runs here)."""
    cluster_names: Any
    """tools/kubelet/env.py cluster_name_pattern: names rewritten to 127.0.0.1."""
    restart_backoff_s: float = 10.0


class _Run:
    """One run of one container: a LocalPod plus when it started."""

    def __init__(self, pod: LocalPod) -> None:
        self.pod = pod
        self.started_at = now_iso()


class PodWorker(threading.Thread):
    """Runs one pod to its end; `update` passes it newer versions of the pod object."""

    def __init__(self, pod: Mapping[str, Any], ctx: NodeContext) -> None:
        meta = pod["metadata"]
        super().__init__(name=f"pod-{meta['namespace']}/{meta['name']}", daemon=True)
        self.ctx = ctx
        self.pod = dict(pod)
        self.uid = meta["uid"]
        self.namespace = meta["namespace"]
        self.pod_name = meta["name"]
        spec = pod["spec"]
        self.restart_policy = spec.get("restartPolicy", "Always")
        self.sandbox = PodSandbox(
            ctx.node_root / "pods" / f"{self.namespace}_{self.pod_name}_{self.uid}",
            ctx.node_root,
            ctx.storage_root,
        )
        self.init = [ContainerState(c["name"], c.get("image", "")) for c in spec.get("initContainers") or []]
        self.main = [ContainerState(c["name"], c.get("image", "")) for c in spec["containers"]]
        self._runs: dict[str, _Run] = {}
        self._start_failed: set[str] = set()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._grace_s: float | None = None
        self._lost = False
        self._gone = False
        self._disruption: dict[str, Any] = {}
        self._posted: dict[str, Any] | None = None
        self._start_time = now_iso()
        self._phase = "Pending"
        self._init_done = not self.init
        self._sidecars: list[ContainerState] = []
        self._folders: dict[str, Path] = {}
        self.finished = threading.Event()

    # -- what the kubelet tells the worker ---------------------------------------------------------
    def update(self, pod: Mapping[str, Any]) -> None:
        meta = pod["metadata"]
        if meta.get("deletionTimestamp") and not self._stopping.is_set():
            grace = meta.get("deletionGracePeriodSeconds")
            if grace is None:
                grace = pod["spec"].get("terminationGracePeriodSeconds", 30)
            self._grace_s = float(grace)
            self._stopping.set()

    def gone(self) -> None:
        """The pod object was removed (force-deleted): kill everything now, report nothing."""
        self._gone = True
        self._grace_s = 0.0
        self._stopping.set()

    def lose(self) -> set[int]:
        """The node is lost: every process killed at once, nothing more reported (see report_lost)."""
        self._lost = True
        self._stopping.set()
        killed: set[int] = set()
        with self._lock:
            for run in self._runs.values():
                killed |= run.pod.kill()
        return killed

    def log_file(self, container: str, previous: bool = False) -> Path | None:
        """The log of the container's current run (or the run before it)."""
        state = next((c for c in [*self.init, *self.main] if c.name == container), None)
        if state is None:
            return None
        restart = state.restart_count - (1 if previous else 0)
        return self.sandbox.log_path(container, restart) if restart >= 0 else None

    def container_running(self, container: str) -> bool:
        with self._lock:
            run = self._runs.get(container)
            return run is not None and run.pod.poll() is None

    # -- the pod's life ----------------------------------------------------------------------------
    def run(self) -> None:
        try:
            self._live()
        except Exception:  # a bug here must not take the kubelet down; the pod is reported failed
            log.exception("pod %s/%s: the worker failed", self.namespace, self.pod_name)
            self._kill_all()
            if not (self._lost or self._gone):
                self._phase = "Failed"
                self._post(reason="KubeletError")
        finally:
            self._kill_all()
            if not self._lost:
                shutil_volumes(self.sandbox)
            self.finished.set()

    def _live(self) -> None:
        self._post()
        if not self._set_up_volumes():
            return self._end()
        self._post()
        for spec, state in zip(self.pod["spec"].get("initContainers") or [], self.init, strict=True):
            if not self._run_init(spec, state):
                return self._end()
        self._init_done = True
        for state in self.main:
            state.state = waiting("ContainerCreating")
        specs = {c["name"]: c for c in self.pod["spec"]["containers"]}
        for state in self.main:
            self._start(specs[state.name], state)
        self._phase = "Running"
        self._post()
        probes = _Probes(self.pod["spec"]["containers"])
        due: dict[str, float] = {}
        while not self._stopping.is_set():
            changed = False
            for state in self.main:
                if self._reap(state):
                    changed = True
                    if self._restarts(state):
                        due[state.name] = time.monotonic() + self._backoff(state)
                        self._event("BackOff", f"Back-off restarting failed container {state.name}",
                                    "Warning", state.name)  # fmt: skip
            for name, when in list(due.items()):
                if time.monotonic() >= when:
                    del due[name]
                    state = next(c for c in self.main if c.name == name)
                    state.last_state, state.restart_count = state.state, state.restart_count + 1
                    self._start(specs[name], state)
                    changed = True
            for state in self.main:
                ready = "running" in state.state and probes.ready(state.name)
                changed |= ready != state.ready
                state.ready = ready
            if not due and all("terminated" in c.state for c in self.main):
                self._stop_sidecars()
                self._phase = "Succeeded" if all(c.exit_code == 0 for c in self.main) else "Failed"
                self._post()
                break
            if changed:
                self._post()
            self._stopping.wait(POLL_S)
        self._end()

    def _set_up_volumes(self) -> bool:
        while not self._stopping.is_set():
            try:
                self._folders = self.sandbox.set_up(
                    self.pod,
                    read_object=self.ctx.api.read,
                    issue_token=self.ctx.api.issue_token,
                    host_ip=HOST_IP,
                    pod_ip=POD_IP,
                )
                return True
            except VolumeError as exc:
                self._event("FailedMount", str(exc), "Warning")
                for state in [*self.init, *self.main]:
                    state.state = waiting("ContainerCreating", f"FailedMount: {exc}")
                self._post()
                self._stopping.wait(2.0)
        return False

    def _run_init(self, spec: Mapping[str, Any], state: ContainerState) -> bool:
        """Run one init container until it succeeds; False when the pod fails or is stopped first."""
        if spec.get("restartPolicy") == "Always":
            return self._start_sidecar(spec, state)
        while True:
            self._start(spec, state)
            self._post()
            while not self._reap(state):
                if self._stopping.wait(POLL_S):
                    return False
            self._post()
            if state.exit_code == 0:
                return True
            if self.restart_policy == "Never":
                self._phase = "Failed"
                for main in self.main:
                    main.state = waiting("PodInitializing")
                self._post()
                return False
            if self._stopping.wait(self._backoff(state)):
                return False
            state.last_state, state.restart_count = state.state, state.restart_count + 1

    def _start_sidecar(self, spec: Mapping[str, Any], state: ContainerState) -> bool:
        """A sidecar (an init container with restartPolicy Always): started, then the next container
        waits for its startup probe, run with the container's paths; True once it passed. Not restarted
        here: one that exits before its probe passes fails the pod."""
        self._start(spec, state)
        self._post()
        probe = spec.get("startupProbe")
        if probe and "exec" in probe:
            mounts = mount_map(spec, self._folders)
            command = [self._local(a, mounts) for a in probe["exec"]["command"]]
            period = float(probe.get("periodSeconds", 10))
            while not self._probe_command(command, float(probe.get("timeoutSeconds", 1))):
                if self._reap(state):
                    self._phase = "Failed"
                    self._post()
                    return False
                if self._stopping.wait(period):
                    return False
        state.ready = True
        self._sidecars.append(state)
        self._post()
        return True

    def _probe_command(self, command: list[str], timeout_s: float) -> bool:
        try:
            done = subprocess.run(
                command, env=dict(self.ctx.image_env), cwd=self.ctx.workdir, capture_output=True,
                timeout=timeout_s, check=False,
            )  # fmt: skip
        except (OSError, subprocess.TimeoutExpired):
            return False
        return done.returncode == 0

    def _stop_sidecars(self) -> None:
        """After the last main container ended: SIGTERM to each sidecar, SIGKILL after the grace period."""
        with self._lock:
            runs = {s.name: self._runs[s.name] for s in self._sidecars if s.name in self._runs}
        for run in runs.values():
            with _quiet():
                os.kill(run.pod.pid, signal.SIGTERM)
        deadline = time.monotonic() + float(self.pod["spec"].get("terminationGracePeriodSeconds", 30))
        while time.monotonic() < deadline and any(r.pod.poll() is None for r in runs.values()):
            time.sleep(POLL_S)
        for state in self._sidecars:
            left = runs.get(state.name)
            if left is not None and left.pod.poll() is None:
                left.pod.kill()
            self._reap(state)

    def _start(self, spec: Mapping[str, Any], state: ContainerState) -> None:
        started = now_iso()
        try:
            argv, env, cwd = self._command(spec)
            proc = LocalPod(
                f"{self.pod_name}/{state.name}",
                argv,
                env,
                self.sandbox.log_path(state.name, state.restart_count),
                cwd=cwd,
            )
            proc.start()
        except (EnvError, OSError) as exc:
            self._event("Failed", f"Error: {exc}", "Warning", state.name)
            state.state = terminated(START_ERROR_EXIT, started, "StartError", str(exc))
            state.pid = None
            self._start_failed.add(state.name)
            return
        with self._lock:
            self._runs[state.name] = _Run(proc)
        state.state = running(started)
        state.pid = proc.pid
        self._event("Started", f"Started container {state.name}", container=state.name)

    def _command(self, spec: Mapping[str, Any]) -> tuple[list[str], dict[str, str], Path]:
        env = container_env(self.pod, spec, read_data=self.ctx.api.read_data, host_ip=HOST_IP, pod_ip=POD_IP)
        argv = container_argv(spec, env)
        mounts = mount_map(spec, self._folders)
        env = {k: self._local(v, mounts) for k, v in env.items()}
        named_endpoint = any(
            a.startswith(RDZV_ENDPOINT_FLAGS) and self.ctx.cluster_names.search(a) for a in argv
        )
        argv = [self._local(a, mounts) for a in argv]
        if named_endpoint:
            # The endpoint named a Service, which no launcher takes for itself; rewritten to 127.0.0.1 it
            # would look like this host to every launcher (torch counts any loopback address as its own),
            # and each would try to host the store. `is_host=0` keeps what the name meant.
            argv = with_rdzv_host(argv, False)
        cwd = Path(self._local(spec["workingDir"], mounts)) if spec.get("workingDir") else self.ctx.workdir
        return argv, {**self.ctx.image_env, **env}, cwd

    def _local(self, text: str, mounts: MountMap) -> str:
        return mounts.rewrite(rewrite_cluster_names(text, self.ctx.cluster_names))

    def _reap(self, state: ContainerState) -> bool:
        """True when the container's run has just ended (its state is then terminated)."""
        if state.name in self._start_failed:
            self._start_failed.discard(state.name)
            return True
        with self._lock:
            run = self._runs.get(state.name)
            if run is None:
                return False
            rc = run.pod.poll()
            if rc is None:
                return False
            # What the main process left behind dies with the container.
            for pid in run.pod.processes():
                with _quiet():
                    os.kill(pid, signal.SIGKILL)
            del self._runs[state.name]
        state.state = terminated(exit_code(rc), run.started_at)
        state.ready = False
        return True

    def _restarts(self, state: ContainerState) -> bool:
        return self.restart_policy == "Always" or (
            self.restart_policy == "OnFailure" and state.exit_code != 0
        )

    def _backoff(self, state: ContainerState) -> float:
        return min(MAX_BACKOFF_S, self.ctx.restart_backoff_s * (2 ** min(state.restart_count, 10)))

    def _end(self) -> None:
        """Stopped (deleted, lost, gone) or finished: stop what runs, report, confirm a deletion."""
        if self._lost:
            return
        if self._gone:
            self._kill_all()
            return
        if self._stopping.is_set():
            self._terminate(self._grace_s if self._grace_s is not None else 30.0)
            if self._phase not in ("Succeeded", "Failed"):
                done = [c for c in self.main if "terminated" in c.state]
                ok = len(done) == len(self.main) and all(c.exit_code == 0 for c in done)
                self._phase = "Succeeded" if ok and self._init_done else "Failed"
            for state in [*self.init, *self.main]:
                if "running" in state.state or "waiting" in state.state:
                    if "waiting" in state.state and state.restart_count == 0 and state.pid is None:
                        continue
                    state.state = terminated(137, state.state.get("running", {}).get("startedAt", now_iso()))
                    state.ready = False
            self._post()
            self.ctx.api.delete_pod_now(self.namespace, self.pod_name, self.uid)

    def _terminate(self, grace_s: float) -> None:
        with self._lock:
            runs = dict(self._runs)
        for name, run in runs.items():
            self._event("Killing", f"Stopping container {name}", container=name)
            with _quiet():
                os.kill(run.pod.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(r.pod.poll() is None for r in runs.values()):
            time.sleep(POLL_S)
        for name, run in runs.items():
            state = next(c for c in [*self.init, *self.main] if c.name == name)
            if run.pod.poll() is None:
                run.pod.kill()
            self._reap(state)

    def _kill_all(self) -> None:
        with self._lock:
            runs = list(self._runs.values())
        for run in runs:
            run.pod.kill()

    def _event(self, reason: str, message: str, kind: str = "Normal", container: str = "") -> None:
        names = {c["name"]: f"spec.containers{{{c['name']}}}" for c in self.pod["spec"]["containers"]}
        names.update(
            {
                c["name"]: f"spec.initContainers{{{c['name']}}}"
                for c in self.pod["spec"].get("initContainers") or []
            }
        )
        self.ctx.api.record_event(self.pod, self.ctx.node, reason, message, kind, names.get(container, ""))

    # -- status ------------------------------------------------------------------------------------
    def _post(self, reason: str = "") -> None:
        if self._lost or self._gone:
            return
        status = pod_status(
            phase=self._phase,
            start_time=self._start_time,
            init=self.init,
            main=self.main,
            initialized=self._init_done,
            reason=reason,
        )
        if same_status(self._posted, status):
            return
        if self.ctx.api.patch_pod_status(self.namespace, self.pod_name, status):
            self._posted = status

    def report_lost(self, disruption: Mapping[str, Any]) -> None:
        """After the loss (the worker has ended): the pod Failed, with `disruption` among its conditions."""
        self._disruption = dict(disruption)
        for state in [*self.init, *self.main]:
            if "running" in state.state:
                state.state = terminated(137, state.state["running"]["startedAt"], "Error", "node lost")
            state.ready = False
        status = pod_status(
            phase="Failed",
            start_time=self._start_time,
            init=self.init,
            main=self.main,
            initialized=self._init_done,
            extra_conditions=[self._disruption],
            reason="NodeLost",
            message=f"node {self.ctx.node} was lost",
        )
        self.ctx.api.patch_pod_status(self.namespace, self.pod_name, status)


def disruption_condition(node: str) -> dict[str, Any]:
    """The condition the kubelet puts on the pods it stops when its node shuts down."""
    return condition("DisruptionTarget", True, "TerminationByKubelet", f"node {node} was lost")


def shutil_volumes(sandbox: PodSandbox) -> None:
    """A stopped pod's volumes go (its memory-backed /dev/shm above all); its logs stay for reading."""
    import shutil

    sandbox.remove_short_link()
    shutil.rmtree(sandbox.volumes_dir, ignore_errors=True)


class _quiet:
    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> bool:
        return kind is not None and issubclass(kind, (ProcessLookupError, PermissionError))


class _Probes:
    """Readiness probes (tcpSocket, exec, httpGet), each run every periodSeconds; a container without
    one is ready while it runs. Liveness and startup probes are not run."""

    def __init__(self, containers: list[Mapping[str, Any]]) -> None:
        self._specs = {c["name"]: c for c in containers}
        self._last: dict[str, tuple[float, bool]] = {}
        self._first = time.monotonic()

    def ready(self, name: str) -> bool:
        spec = self._specs[name]
        probe = spec.get("readinessProbe")
        if not probe:
            return True
        now = time.monotonic()
        last = self._last.get(name)
        period = float(probe.get("periodSeconds", 10))
        if now - self._first < float(probe.get("initialDelaySeconds", 0)):
            return False
        if last is not None and now - last[0] < period:
            return last[1]
        ok = _probe(probe, spec)
        self._last[name] = (now, ok)
        return ok


def _port(value: Any, spec: Mapping[str, Any]) -> int:
    if isinstance(value, int) or str(value).isdigit():
        return int(value)
    for port in spec.get("ports") or []:
        if port.get("name") == value:
            return int(port["containerPort"])
    return -1


def _probe(probe: Mapping[str, Any], spec: Mapping[str, Any]) -> bool:
    timeout = float(probe.get("timeoutSeconds", 1))
    if "tcpSocket" in probe:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            return sock.connect_ex(("127.0.0.1", _port(probe["tcpSocket"]["port"], spec))) == 0
    if "exec" in probe:
        try:
            return (
                subprocess.run(
                    probe["exec"]["command"], capture_output=True, timeout=timeout, check=False
                ).returncode
                == 0
            )
        except (OSError, subprocess.TimeoutExpired):
            return False
    if "httpGet" in probe:
        get = probe["httpGet"]
        url = f"http://127.0.0.1:{_port(get['port'], spec)}{get.get('path', '/')}"
        try:
            with urllib.request.urlopen(url, timeout=timeout) as resp:
                return 200 <= resp.status < 400
        except OSError:
            return False
    return True
