"""Run the project's helm binary on the chart: render manifests or capture its error."""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import yaml

REPO_ROOT = Path(__file__).resolve().parents[2]
HELM = REPO_ROOT / ".tools" / "bin" / "helm"
CHART = REPO_ROOT / "k8s"
JOBSET_API = "jobset.x-k8s.io/v1alpha2"


def helm(*args: str, values: dict[str, Any] | None = None) -> subprocess.CompletedProcess[str]:
    """Run helm with `args`; `values` go in as a values file written as JSON (a YAML subset): every value
    reaches helm with its Python type, where PyYAML would leave a string like `0e0` unquoted and helm's
    YAML 1.2 parser would read it as a number."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", encoding="utf-8") as vf:
        json.dump(values or {}, vf, allow_nan=False, ensure_ascii=False)  # Go reads no surrogate-pair escapes
        vf.flush()
        return subprocess.run(
            [str(HELM), *args, "-f", vf.name], capture_output=True, text=True, timeout=60, check=False
        )


def template_result(
    values: dict[str, Any] | None = None, *extra: str, release: str = "smoke", namespace: str = "team-a"
) -> subprocess.CompletedProcess[str]:
    """`helm template` of the chart (with the JobSet API declared, so workload=jobset renders)."""
    return helm(
        "template",
        release,
        str(CHART),
        "--namespace",
        namespace,
        "--api-versions",
        JOBSET_API,
        *extra,
        values=values,
    )


def render(values: dict[str, Any] | None = None, *extra: str, **kwargs: str) -> list[dict[str, Any]]:
    """Rendered manifests (hooks included); fails the test with helm's message on an error."""
    result = template_result(values, *extra, **kwargs)
    assert result.returncode == 0, result.stderr
    # libyaml's parser (CSafeLoader): the same documents, several times faster than the pure-Python one.
    return [doc for doc in yaml.load_all(result.stdout, Loader=yaml.CSafeLoader) if doc]


def rejection(values: dict[str, Any] | None = None, *extra: str) -> str:
    """helm's error message for values that must be rejected (fails the test if they render)."""
    result = template_result(values, *extra)
    assert result.returncode != 0, f"helm accepted values it should reject: {values} {extra}"
    return result.stderr


def by_kind(manifests: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [m for m in manifests if m["kind"] == kind]


def workload_pod_spec(manifests: list[dict[str, Any]]) -> dict[str, Any]:
    """The trainer pod spec of the rendered Job or JobSet."""
    jobs = by_kind(manifests, "Job")
    if jobs:
        return jobs[0]["spec"]["template"]["spec"]
    (jobset,) = by_kind(manifests, "JobSet")
    return jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]


def trainer_container(manifests: list[dict[str, Any]]) -> dict[str, Any]:
    (container,) = [c for c in workload_pod_spec(manifests)["containers"] if c["name"] == "trainer"]
    return container


def env_of(container: dict[str, Any]) -> dict[str, str]:
    """The container's plain env values (the chart uses no valueFrom in the trainer container)."""
    return {e["name"]: e["value"] for e in container.get("env", [])}


def rendered_trainer_config(tmp_path: Path, values: dict[str, Any]) -> Any:
    """The TrainConfig the trainer parses from the chart's rendered command (with a tiny token file)."""
    import numpy as np

    from tools.podcommand import launcher_argv
    from tools.podspec import expand
    from trainer.config.train_config import config_from_args

    data = tmp_path / "tokens.npy"
    np.save(data, np.zeros(4096, dtype=np.uint16))
    container = trainer_container(render({**values, "dataPath": str(data), "device": "cpu"}))
    env = env_of(container)
    argv = launcher_argv([expand(a, env) for a in container["command"] + container["args"]])
    return config_from_args(argv[argv.index("-m") + 2 :], env={})
