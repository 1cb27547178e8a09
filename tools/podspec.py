"""Take the trainer's pod commands out of rendered manifests and prepare them to run as local processes.

Kubernetes expands `$(VAR)` in a container's command and args from the container's env (kubelet
semantics: `$$` is a literal `$`, an unknown variable stays as written). Doing the same here means
the demo runs exactly the commands a pod runs, with only cluster places swapped for local ones.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import yaml

_VAR_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


@dataclass(frozen=True)
class Container:
    """One container's argv and literal env, as rendered."""

    name: str
    argv: list[str]
    env: dict[str, str]

    def resolved_argv(self, overrides: dict[str, str]) -> list[str]:
        """The argv the kubelet would exec, with `overrides` replacing env values."""
        env = {**self.env, **overrides}
        return [expand(arg, env) for arg in self.argv]


@dataclass(frozen=True)
class PodTemplate:
    """The trainer Job's pod: its init containers that run to completion (in order), its trainer
    container, and its sidecars (init containers with restartPolicy Always: they run beside the trainer,
    so a harness that runs the init containers one after another leaves them out)."""

    job_name: str
    init_containers: list[Container]
    trainer: Container
    sidecars: tuple[Container, ...] = ()


def expand(text: str, env: dict[str, str]) -> str:
    """Expand `$(VAR)` references the way the kubelet does."""

    def substitute(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        return env.get(match.group(1), match.group(0))

    return _VAR_REF.sub(substitute, text)


def with_trainer_options(argv: list[str], options: list[str]) -> list[str]:
    """`argv` with `options` given to the trainer first (right after `-m trainer`), the way a local run
    adds what the chart leaves to the trainer's defaults (its snapshot directory); unchanged when `argv`
    does not run the trainer."""
    for i in range(len(argv) - 1):
        if argv[i : i + 2] == ["-m", "trainer"]:
            return [*argv[: i + 2], *options, *argv[i + 2 :]]
    return list(argv)


def load_manifests(rendered: str) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(rendered) if doc]


def trainer_pod(manifests: list[dict[str, Any]], container_name: str = "trainer") -> PodTemplate:
    """The pod template of the rendered trainer Job (the chart's default workload)."""
    jobs = [m for m in manifests if m.get("kind") == "Job" and "helm.sh/hook" not in _annotations(m)]
    if len(jobs) != 1:
        raise ValueError(f"expected one trainer Job in the rendered chart, found {len(jobs)}")
    job = jobs[0]
    spec = job["spec"]["template"]["spec"]
    main = [c for c in spec["containers"] if c["name"] == container_name]
    inits = spec.get("initContainers", [])
    if not main:
        raise ValueError(f"no container named {container_name!r} in Job {job['metadata']['name']}")
    return PodTemplate(
        job_name=job["metadata"]["name"],
        init_containers=[_container(c) for c in inits if c.get("restartPolicy") != "Always"],
        trainer=_container(main[0]),
        sidecars=tuple(_container(c) for c in inits if c.get("restartPolicy") == "Always"),
    )


def _container(raw: dict[str, Any]) -> Container:
    # Only literal values travel; downward-API values (fieldRef) are set per pod by whoever runs it.
    env = {item["name"]: str(item["value"]) for item in raw.get("env", []) if "value" in item}
    return Container(raw["name"], list(raw.get("command", [])) + list(raw.get("args", [])), env)


def _annotations(manifest: dict[str, Any]) -> dict[str, str]:
    return manifest.get("metadata", {}).get("annotations") or {}
