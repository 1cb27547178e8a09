"""Take the trainer's pod command out of rendered manifests and prepare it to run as a local process.

Kubernetes expands `$(VAR)` in a container's command and args from the container's env (kubelet
semantics: `$$(VAR)` is a literal `$(VAR)`, an unknown variable stays as written). Doing the same
here means the demo runs exactly the command a pod runs, with only cluster places swapped for
local ones.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import yaml

_VAR_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


@dataclass(frozen=True)
class PodCommand:
    """The trainer container's argv and literal env, as rendered."""

    workload_name: str
    argv: list[str]
    env: dict[str, str]
    field_env: dict[str, str]  # env taken from the downward API (field path), resolved per pod by the caller


def expand(text: str, env: dict[str, str]) -> str:
    """Expand `$(VAR)` references the way the kubelet does."""

    def substitute(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group(1)
        return env.get(name, match.group(0))

    return _VAR_REF.sub(substitute, text)


def load_manifests(rendered: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(rendered) if doc]


def trainer_command(manifests: list[dict[str, Any]], container_name: str = "trainer") -> PodCommand:
    """The trainer container of the rendered Job (the chart's default workload)."""
    jobs = [m for m in manifests if m.get("kind") == "Job" and "helm.sh/hook" not in _annotations(m)]
    if len(jobs) != 1:
        raise ValueError(f"expected one trainer Job in the rendered chart, found {len(jobs)}")
    job = jobs[0]
    containers = job["spec"]["template"]["spec"]["containers"]
    matching = [c for c in containers if c["name"] == container_name]
    if not matching:
        raise ValueError(f"no container named {container_name!r} in Job {job['metadata']['name']}")
    container = matching[0]
    env, field_env = {}, {}
    for item in container.get("env", []):
        if "value" in item:
            env[item["name"]] = str(item["value"])
        elif "fieldRef" in item.get("valueFrom", {}):
            field_env[item["name"]] = item["valueFrom"]["fieldRef"]["fieldPath"]
    argv = list(container.get("command", [])) + list(container.get("args", []))
    return PodCommand(job["metadata"]["name"], argv, env, field_env)


def _annotations(manifest: dict[str, Any]) -> dict[str, str]:
    return manifest.get("metadata", {}).get("annotations") or {}
