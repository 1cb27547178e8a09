"""Start a local control plane, yield how to reach it, stop it: ``running_control_plane(workdir)``.

Order and readiness: etcd (`/health`), the API server (`/readyz`: storage, RBAC bootstrap, the system
priority classes), the controller manager and the scheduler (`/healthz`), then the `default` service
account of the `default` namespace (written by the controller manager's service-account controller: the
proof that controllers act, and what the ServiceAccount admission plugin needs before any pod of that
namespace is accepted). Each component's log is `<workdir>/logs/<name>.log`; the seconds each step took
are in `<workdir>/startup.json` with each component's pid and port. Every start is a fresh cluster: the etcd
data, keys and logs of an earlier start in the same folder are removed first.

Authentication: a static token per user (`--token-auth-file`): `admin` (group system:masters) and the
controller manager's and scheduler's own users, whose permissions RBAC bootstraps. The admin kubeconfig
holds the server, the CA file and the token, which helm, kubectl and the kubernetes client all read.
"""

from __future__ import annotations

import json
import secrets
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import yaml

from tools.controlplane import flags, pki
from tools.controlplane.processes import Component, ControlPlaneError, https_get, start, wait_until
from trainer.runtime.ports import free_port

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_BIN_DIR = REPO_ROOT / ".tools" / "controlplane" / "bin"
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")
READY_TIMEOUT_S = 180.0
"""Per step. The API server's first start on a loaded 2-core machine takes tens of seconds (it bootstraps
RBAC roles, priority classes and the `kubernetes` Service into an empty etcd)."""
ADMIN_USER = "admin"

__all__ = ["DEFAULT_BIN_DIR", "ControlPlane", "ControlPlaneError", "binaries", "running_control_plane"]


@dataclass(frozen=True)
class ControlPlane:
    server: str
    """https://127.0.0.1:<port>"""
    kubeconfig: Path
    """The admin's kubeconfig (server, CA file, token), usable by helm, kubectl and the kubernetes client."""
    ca_file: Path
    """The CA that signed the API server's serving certificate."""
    token: str
    """The admin's bearer token (group system:masters)."""
    workdir: Path


def binaries(bin_dir: Path | None = None) -> dict[str, Path]:
    """The four executables by name; a missing one is an error naming it and how to build it."""
    folder = bin_dir or DEFAULT_BIN_DIR
    found = {name: folder / name for name in BINARIES}
    missing = [name for name, path in found.items() if not path.is_file()]
    if missing:
        raise ControlPlaneError(
            f"{', '.join(missing)} not built in {folder}: `make controlplane` builds the control plane"
        )
    return found


def _layout(workdir: Path) -> flags.Layout:
    # Five consecutive ports found free together, below the ephemeral range (trainer.runtime.ports says why).
    base = free_port(span=5)
    return flags.Layout(workdir, base, base + 1, base + 2, base + 3, base + 4)


def write_kubeconfig(path: Path, server: str, ca_file: Path, user: str, token: str) -> Path:
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "local", "cluster": {"server": server, "certificate-authority": str(ca_file)}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": user}}],
        "current-context": "local",
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    return path


def _credentials(layout: flags.Layout) -> str:
    """Certificates, keys, the token file and the components' kubeconfigs; returns the admin token."""
    folder = layout.pki
    ca = pki.make_ca(folder)
    ips, names = pki.api_server_names(flags.SERVICE_IP)
    pki.serving_cert(ca, folder, "apiserver", ips, names)
    pki.client_cert(
        ca, folder, "apiserver-kubelet-client", "kube-apiserver-kubelet-client", ["system:masters"]
    )
    pki.service_account_key(folder)
    users = {
        ADMIN_USER: "system:masters",
        "system:kube-controller-manager": "",
        "system:kube-scheduler": "",
    }
    tokens = {user: secrets.token_hex(24) for user in users}
    lines = [f'{tokens[user]},{user},{user},"{group}"' for user, group in users.items()]
    (folder / "tokens.csv").write_text("\n".join(lines) + "\n")
    (folder / "tokens.csv").chmod(0o600)
    write_kubeconfig(
        layout.kubeconfig("controller-manager"),
        layout.server,
        ca.cert,
        "system:kube-controller-manager",
        tokens["system:kube-controller-manager"],
    )
    write_kubeconfig(
        layout.kubeconfig("scheduler"),
        layout.server,
        ca.cert,
        "system:kube-scheduler",
        tokens["system:kube-scheduler"],
    )
    write_kubeconfig(layout.kubeconfig(ADMIN_USER), layout.server, ca.cert, ADMIN_USER, tokens[ADMIN_USER])
    return tokens[ADMIN_USER]


def _answers(url: str) -> Callable[[], bool]:
    """A probe of a component's own endpoint: etcd's plain HTTP, or a self-signed certificate on
    127.0.0.1 that is not checked."""
    return lambda: https_get(url, ca_file=None) == 200


@contextmanager
def running_control_plane(
    workdir: Path, *, bin_dir: Path | None = None, controllers: bool = True, scheduler: bool = True
) -> Iterator[ControlPlane]:
    """Start etcd, the API server and (unless turned off) the controller manager and the scheduler under
    `workdir`; yield once all are ready; stop every process on exit, also when the start fails (then the
    ControlPlaneError names the component and ends with the tail of its log)."""
    began = time.monotonic()
    exe = binaries(bin_dir)
    workdir = workdir.resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    # Every start is a fresh cluster: an earlier run's data, keys or logs in the same folder would pair
    # a new CA with old service-account tokens in etcd, and etcd with members on other ports.
    for stale in ("etcd", "pki", "logs", "startup.json"):
        path = workdir / stale
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    layout = _layout(workdir)
    token = _credentials(layout)
    ca_file = layout.pki / "ca.crt"
    seconds: dict[str, float] = {"credentials": time.monotonic() - began}
    started: list[Component] = []

    def launch(name: str, args: list[str]) -> Component:
        component = start(name, exe[name], args, layout.logs)
        started.append(component)
        return component

    def api_ok(path: str) -> bool:
        return https_get(layout.server + path, ca_file=ca_file, token=token) == 200

    try:
        etcd = launch("etcd", flags.etcd(layout))
        seconds["etcd"] = wait_until(etcd, _answers(layout.etcd_url + "/health"), READY_TIMEOUT_S, "healthy")
        api = launch("kube-apiserver", flags.api_server(layout))
        seconds["kube-apiserver"] = wait_until(api, lambda: api_ok("/readyz"), READY_TIMEOUT_S, "ready")
        clients: list[tuple[str, list[str], int]] = []
        if controllers:
            clients.append(
                ("kube-controller-manager", flags.controller_manager(layout), layout.controller_manager_port)
            )
        if scheduler:
            clients.append(("kube-scheduler", flags.scheduler(layout), layout.scheduler_port))
        for name, args, port in clients:
            component = launch(name, args)
            seconds[name] = wait_until(
                component, _answers(f"https://127.0.0.1:{port}/healthz"), READY_TIMEOUT_S, "healthy"
            )
        if controllers:
            (controller_manager,) = [c for c in started if c.name == "kube-controller-manager"]
            seconds["default service account"] = wait_until(
                controller_manager,
                lambda: api_ok("/api/v1/namespaces/default/serviceaccounts/default"),
                READY_TIMEOUT_S,
                "acting (no default service account in the default namespace)",
            )
        seconds["total"] = time.monotonic() - began
        record = {
            "seconds": {k: round(v, 2) for k, v in seconds.items()},
            "pids": {c.name: c.process.pid for c in started},
            "ports": {
                "etcd": layout.etcd_client_port,
                "etcd-peer": layout.etcd_peer_port,
                "kube-apiserver": layout.api_port,
                "kube-controller-manager": layout.controller_manager_port,
                "kube-scheduler": layout.scheduler_port,
            },
            "server": layout.server,
        }
        (workdir / "startup.json").write_text(json.dumps(record, indent=2) + "\n")
        yield ControlPlane(layout.server, layout.kubeconfig(ADMIN_USER), ca_file, token, workdir)
    finally:
        for component in reversed(started):
            component.stop()
