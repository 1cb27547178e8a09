"""A container's environment and command line as the kubelet computes them, made runnable on this host.

Kubernetes semantics kept: `envFrom` first, then `env` in order; each value's `$(VAR)` references are
expanded from the entries before it (`$$` is a literal `$`, an unknown reference stays as written);
`valueFrom` reads the downward API (`fieldRef`, `resourceFieldRef`) and ConfigMap/Secret keys; the
command and args are expanded from the final env. HOSTNAME is the pod's hostname.

What this host needs on top (every pod shares this machine's network namespace and filesystem):
- cluster DNS names (`<service>.<namespace>.svc.<domain>`, `<pod>.<subdomain>.<namespace>.svc.<domain>`)
  do not resolve here; every pod listens on 127.0.0.1, so each such name in an env value or argument
  becomes 127.0.0.1 (`rewrite_cluster_names`);
- a volume's mountPath does not exist here; each path under a mount in an env value, an argument or the
  working directory becomes the volume's local folder (tools/kubelet/sandbox.py `MountMap.rewrite`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

from tools.podspec import expand

#: Reads a ConfigMap's or Secret's data: (kind, namespace, name) -> {key: text}; None when absent.
DataReader = Callable[[str, str, str], Mapping[str, str] | None]


class EnvError(RuntimeError):
    """An env entry cannot be resolved (a missing, non-optional ConfigMap or Secret key)."""


def cluster_name_pattern(cluster_domain: str) -> re.Pattern[str]:
    """Names that cluster DNS would resolve: anything ending in `.svc.<domain>` (a Service or a pod's
    hostname under a headless Service)."""
    return re.compile(r"\b[a-z0-9](?:[-a-z0-9.]*[a-z0-9])?\.svc\." + re.escape(cluster_domain) + r"\b\.?")


def rewrite_cluster_names(text: str, pattern: re.Pattern[str]) -> str:
    return pattern.sub("127.0.0.1", text)


def field_value(pod: Mapping[str, Any], path: str, host_ip: str, pod_ip: str) -> str:
    """The downward API's `fieldRef.fieldPath` of `pod` (a dict as the API serves it)."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    for prefix, source in (("metadata.labels", "labels"), ("metadata.annotations", "annotations")):
        if path.startswith(prefix + "["):
            key = path[len(prefix) + 1 : -1].strip("'\"")
            return str((meta.get(source) or {}).get(key, ""))
    simple = {
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace", ""),
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", ""),
        "status.hostIP": host_ip,
        "status.hostIPs": host_ip,
        "status.podIP": pod_ip,
        "status.podIPs": pod_ip,
    }
    if path not in simple:
        raise EnvError(f"fieldRef {path!r}: not a field the downward API serves")
    return str(simple[path])


def resource_value(container: Mapping[str, Any], resource: str) -> str:
    """`resourceFieldRef.resource` (divisor 1): the container's limit, else its request, else 0."""
    kind, _, name = resource.partition(".")
    resources = container.get("resources") or {}
    value = (resources.get(kind) or {}).get(name)
    if value is None and kind == "limits":
        value = (resources.get("requests") or {}).get(name)
    return str(value if value is not None else 0)


def container_env(
    pod: Mapping[str, Any],
    container: Mapping[str, Any],
    *,
    read_data: DataReader,
    host_ip: str,
    pod_ip: str,
) -> dict[str, str]:
    """The env Kubernetes gives `container` of `pod` (before any rewriting for this host)."""
    namespace = pod["metadata"]["namespace"]
    env: dict[str, str] = {}
    spec = pod.get("spec") or {}
    hostname = spec.get("hostname") or pod["metadata"]["name"]
    env["HOSTNAME"] = hostname
    for source in container.get("envFrom") or []:
        prefix = source.get("prefix", "")
        for kind, key in (("configmap", "configMapRef"), ("secret", "secretRef")):
            ref = source.get(key)
            if ref is None:
                continue
            data = read_data(kind, namespace, ref["name"])
            if data is None:
                if ref.get("optional"):
                    continue
                raise EnvError(f"envFrom: {kind} {ref['name']!r} not found")
            env.update({prefix + k: v for k, v in data.items()})
    for item in container.get("env") or []:
        name = item["name"]
        if "value" in item:
            env[name] = expand(str(item["value"]), env)
            continue
        ref = item.get("valueFrom") or {}
        if "fieldRef" in ref:
            env[name] = field_value(pod, ref["fieldRef"]["fieldPath"], host_ip, pod_ip)
        elif "resourceFieldRef" in ref:
            env[name] = resource_value(container, ref["resourceFieldRef"]["resource"])
        elif "configMapKeyRef" in ref or "secretKeyRef" in ref:
            kind, key_ref = (
                ("configmap", ref["configMapKeyRef"])
                if "configMapKeyRef" in ref
                else ("secret", ref["secretKeyRef"])
            )
            data = read_data(kind, namespace, key_ref["name"])
            if data is None or key_ref["key"] not in data:
                if key_ref.get("optional"):
                    continue
                raise EnvError(f"env {name}: {kind} {key_ref['name']!r} has no key {key_ref['key']!r}")
            env[name] = data[key_ref["key"]]
        else:
            env[name] = ""
    return env


def container_argv(container: Mapping[str, Any], env: Mapping[str, str]) -> list[str]:
    """command + args with `$(VAR)` expanded from `env`. A container without a command runs its image's
    entry point; the image here has none, so one must be given."""
    argv = [*(container.get("command") or []), *(container.get("args") or [])]
    if not argv:
        raise EnvError(f"container {container['name']!r}: no command (this node's image has no entry point)")
    return [expand(str(arg), dict(env)) for arg in argv]
