"""The trainer's pod command for local runs, taken from the rendered chart: one builder for the tests
and the benchmarks, so what they run cannot drift from what a pod runs (Contract 2 of docs/design.md).

``pod_argv(values, places)`` renders k8s/ with ``helm template`` and the given chart values, takes the
trainer container's argv (``[python -m trainer.launcher] ft_launcher ... -m trainer ...``) and expands
its ``$(VAR)`` references the way the kubelet does, with the env entries that name cluster places
(rendezvous endpoint, data, checkpoint and output paths) swapped for local ones, and gives the trainer a
snapshot directory of the run's own (the chart names none: a pod's is the trainer's default in its
/dev/shm, which local "pods" on one host would share); ``ft_launcher`` and ``python`` come from this
virtualenv.
``trainer_argv`` is the part after the launcher (``-m trainer ...``), for runs under torchrun or alone.
Both end with the entry point's own arguments: ``--``, the reference model's options when the entry point
is the reference (its ``--data-path`` is the local data), then each ``entrypointArgs`` item exactly as
written (the chart doubles every ``$`` so that the kubelet's expansion, and ``expand`` here, give the
written text back; a ``$(VAR)`` there is the team's text, not a reference). ``with_options`` adds
trainer options to such a command where the trainer still reads them: before that ``--``.
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tools.podspec import PodTemplate, load_manifests, trainer_pod, with_trainer_options

REPO = Path(__file__).resolve().parent.parent
CHART = REPO / "k8s"
HELM = REPO / ".tools" / "bin" / "helm"
VENV_BIN = Path(sys.executable).parent

# Values every local run needs whatever it tests: CPU, no EFA devices, no metrics port (ranks of
# several local "pods" share one host), the Job not suspended.
LOCAL_VALUES: dict[str, Any] = {"device": "cpu", "efaPerNode": 0, "metricsPort": 0, "suspend": False}


class RenderError(RuntimeError):
    """helm could not render the chart with these values (its stderr is the message)."""


# The chart's key files name Secrets mounted in the pod; a local run has none and uses the trainer's local
# fallbacks (a replica key from the restore agreement, a checkpoint key beside the checkpoints).
LOCAL_KEY_FILES = {"TRAINER_REPLICA_KEY_FILE": "", "TRAINER_CKPT_KEY_FILE": ""}


@dataclass(frozen=True)
class LocalPlaces:
    """Where a local run keeps what a pod keeps on the cluster (the env entries Contract 2 names)."""

    rdzv_port: int
    data: Path
    out_dir: Path
    ckpt_dir: Path | None = None
    """Default: ``out_dir/ckpt``, the trainer's own default."""
    local_ckpt_dir: Path | None = None
    """Default: ``out_dir/../local``: a node-local tier beside the run, never inside ``ckpt_dir``."""
    snapshot_dir: Path | None = None
    """The pod's /dev/shm. Default: ``<out_dir>-shm``, one per run (tools/localpods.py node_places: one
    per pod)."""

    @property
    def shm(self) -> Path:
        return self.snapshot_dir or self.out_dir.parent / f"{self.out_dir.name}-shm"

    def trainer_options(self) -> list[str]:
        """What a local run gives the trainer beyond the pod command: a snapshot directory of its own
        (on the cluster, the trainer's default in the pod's /dev/shm)."""
        return [f"--snapshot-dir={self.shm}"]

    def env(self) -> dict[str, str]:
        out = self.out_dir
        return {
            "RDZV_ENDPOINT": f"127.0.0.1:{self.rdzv_port}",
            "DATA_PATH": str(self.data),
            "OUT_DIR": str(out),
            "CHECKPOINT_DIR": str(self.ckpt_dir or out / "ckpt"),
            "LOCAL_CHECKPOINT_DIR": str(self.local_ckpt_dir or out.parent / f"{out.name}-local"),
            # The key Secrets the chart mounts (docs/design.md Contract 5) are not here: empty, the trainer
            # uses its local fallbacks.
            **LOCAL_KEY_FILES,
        }


def render(values: Mapping[str, Any]) -> PodTemplate:
    """The trainer pod of the chart rendered with ``LOCAL_VALUES`` and then ``values``."""
    return _render(json.dumps({**LOCAL_VALUES, **values}, sort_keys=True))


@functools.lru_cache(maxsize=32)
def _render(values_json: str) -> PodTemplate:
    if not HELM.is_file():
        raise RenderError(f"{HELM} is missing: run `make setup` (it installs helm)")
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as vf:
        yaml.safe_dump(json.loads(values_json), vf)  # a values file: numbers keep their YAML types
        vf.flush()
        proc = subprocess.run(
            [str(HELM), "template", "local", str(CHART), "--namespace", "local", "-f", vf.name],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    if proc.returncode != 0:
        raise RenderError(f"helm template failed: {proc.stderr.strip()}")
    return trainer_pod(load_manifests(proc.stdout))


def pod_argv(values: Mapping[str, Any], places: LocalPlaces) -> list[str]:
    """The trainer container's argv as the kubelet would exec it, with local places and launcher."""
    trainer = render(values).trainer
    argv = with_trainer_options(trainer.resolved_argv(places.env()), places.trainer_options())
    options, _ = split_entry_args(argv)
    if "$(" in " ".join(options):
        raise RenderError(f"unexpanded $(VAR) left in the pod command: {argv}")
    rest = launcher_argv(argv)  # preforkWorkers: the wrapper (this venv's python) before the launcher
    prefix = [sys.executable, *argv[1 : len(argv) - len(rest)]] if len(rest) < len(argv) else []
    argv = rest
    launcher = VENV_BIN / argv[0]
    return [*prefix, str(launcher) if launcher.is_file() else argv[0], *argv[1:]]


def split_entry_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """(the command up to the trainer's options, the entry point's arguments): the cut is the first
    ``--`` after ``-m trainer``, where the trainer itself cuts (trainer/config/train_config.py
    split_entry_args)."""
    for i in range(len(argv) - 1):
        if argv[i : i + 2] == ["-m", "trainer"]:
            rest = argv[i + 2 :]
            if "--" in rest:
                cut = i + 2 + rest.index("--")
                return argv[:cut], argv[cut + 1 :]
            break
    return list(argv), []


def flag_name(arg: str) -> str:
    """`--no-inprocess` and `--inprocess=...` -> inprocess: the trainer's parser counts both as one flag."""
    return arg.split("=", 1)[0].removeprefix("--").removeprefix("no-")


def with_options(argv: list[str], options: list[str] | tuple[str, ...]) -> list[str]:
    """`argv` with `options` last among the trainer's own options, before the entry point's arguments
    (after them, the trainer would hand them to the entry point): how a local run adds to or overrides
    what the chart rendered. The trainer refuses a flag given twice, so each option replaces the same
    flag (or its --no- twin) the chart rendered for the trainer; `--fault` adds up, keeping the chart's."""
    head, entry = split_entry_args(argv)
    start = next((i + 2 for i in range(len(head) - 1) if head[i : i + 2] == ["-m", "trainer"]), 0)
    tail = ["--", *entry] if len(head) < len(argv) else []
    return [*head[:start], *replacing(head[start:], options), *tail]


def replacing(args: Sequence[str], options: Sequence[str]) -> list[str]:
    """`args` then `options`, each option replacing the same flag (or its --no- twin) in `args`: the
    trainer's parser, and the reference model's, refuse a flag given twice. `--fault` adds up."""
    given = {flag_name(o) for o in options if o.startswith("--") and flag_name(o) != "fault"}
    return [*(a for a in args if not (a.startswith("--") and flag_name(a) in given)), *options]


def launcher_argv(argv: list[str]) -> list[str]:
    """`argv` from the launcher on: a pod command without the preforkWorkers wrapper in front."""
    return argv[3:] if argv[1:3] == ["-m", "trainer.launcher"] else argv


def trainer_argv(values: Mapping[str, Any], places: LocalPlaces) -> list[str]:
    """The trainer's part of the pod command: ``-m trainer`` and its options."""
    argv = pod_argv(values, places)
    for i in range(len(argv) - 1):
        if argv[i : i + 2] == ["-m", "trainer"]:
            return argv[i:]
    raise RenderError(f"no `-m trainer` in the pod command: {argv}")


#: The launcher options the rendezvous service takes over from the pod command (same names, same
#: values): the node range, backend, endpoint, rendezvous id and its --rdzv-conf.
RENDEZVOUS_OPTIONS = ("--nnodes", "--rdzv-backend", "--rdzv-endpoint", "--rdzv-id", "--rdzv-conf")


def rendezvous_argv(pod_command: list[str]) -> list[str]:
    """The rendezvous service's command for the job whose pods run `pod_command` (the chart's
    `<release>-rendezvous` Deployment runs the same: tests/chart check the two agree): this venv's
    `python -m trainer.launcher.rendezvous` with the launcher's rendezvous options as they are (the
    service ignores their `is_host=0`: it is the host)."""
    launcher = launcher_argv(pod_command)
    options = []
    for arg in launcher[1:]:
        if arg in ("-m", "--"):
            break
        if arg.partition("=")[0] in RENDEZVOUS_OPTIONS:
            options.append(arg)
    missing = [o for o in RENDEZVOUS_OPTIONS[:4] if not any(a.startswith(o + "=") for a in options)]
    if missing:
        raise RenderError(f"the pod command has no {', '.join(missing)}: {pod_command}")
    return [sys.executable, "-m", "trainer.launcher.rendezvous", *options, "--ft-enable-log-server=false"]
