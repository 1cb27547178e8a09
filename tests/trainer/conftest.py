"""Fixtures shared by the trainer tests: a small token file, a 1-rank process group, the fault-free
reference run that every exact-resume test compares its final state with, and the run with a fault of
each tier that test_exact_resume.py and resilience/test_unrecoverable.py both read."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

from tests.helpers import free_port


@pytest.fixture(scope="session", autouse=True)
def helper_server() -> None:
    """This test process's NVRx helpers forked from a fork server, as a rank's are: started before the
    collection (tests/helper_servers.py), or here where that did not run; a warning where neither could."""
    from tests import helper_servers
    from trainer.checkpoint import helper_server

    helper_servers.start()
    if not helper_server.running():
        import threading

        names = ", ".join(t.name for t in threading.enumerate())
        warnings.warn(f"no fork server for NVRx's helpers (threads: {names}): they are spawned", stacklevel=1)


@pytest.fixture(scope="session")
def token_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from trainer.reference.data import write_synthetic_tokens
    from trainer.reference.model import PRESETS

    return write_synthetic_tokens(
        tmp_path_factory.mktemp("data") / "tokens.npy", 100_000, PRESETS["tiny"].vocab_size, seed=3
    )


@pytest.fixture
def one_rank(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A 1-rank gloo default group in this process and a 1-device CPU mesh."""
    # monkeypatch restores the environment: a leaked MASTER_ADDR would change later tests' subprocesses.
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="session")
def clean_run(token_file: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The fault-free run of the pod command (_jobs.RUN_VALUES: ft_launcher, tier 1 on, the chart's nvrx
    checkpoints): its output directory and the sha256 of its final model + optimizer state.

    One run for the whole session: the final state depends only on data, seed, preset and steps, not on
    the launcher, the checkpoint mode or retention (each exact-resume test asserts so against it).
    """
    from tests.trainer._jobs import assert_completed, log_tail, of, pod_command, read_events, run_job

    out = tmp_path_factory.mktemp("clean") / "run"
    log = out.parent / "job.log"
    assert run_job(pod_command(token_file, out), log) == 0, log_tail(log)
    assert_completed(out, log)
    evs = read_events(out)
    assert not of(evs, "fault_injected") and not of(evs, "fault_detected"), log_tail(log)
    (end,) = of(evs, "run_end", rank=0, status="completed")
    digest = str(end["state_sha256"])
    assert len(digest) == 64
    return out, digest


# The faults of `faulty_run`: an exception (tier 1, recovered in-process), later a SIGKILL (tier 2). nvrx
# commits a save at a later step than it starts it, so each fires at the step right after a save started
# (saves after steps 2, 5, 8, 9): at step 6 the newest committed checkpoint is usually step 2, at 9 step 5
# (how many steps a commit takes depends on the load: the tests read which one it was).
FAULTY_RUN_FAULTS = ("--fault=exception:step=6:rank=1", "--fault=sigkill:step=9:rank=0")


@pytest.fixture(scope="session")
def faulty_run(token_file: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The pod command of `clean_run` with FAULTY_RUN_FAULTS: its output directory and its log. The
    launcher's exit status was 0; what the run did is each reading test's to assert.

    One run for the session: test_exact_resume.py checks both recoveries and the final state against
    `clean_run`; resilience/test_unrecoverable.py that the transient exception was recovered and not
    taken for an unrecoverable error.
    """
    from tests.trainer._jobs import log_tail, pod_command, run_job

    out = tmp_path_factory.mktemp("faulty") / "run"
    log = out.parent / "job.log"
    assert run_job(pod_command(token_file, out, *FAULTY_RUN_FAULTS), log) == 0, log_tail(log)
    return out, log


@pytest.fixture(scope="session")
def pods_clean_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    """(the record, the run directory) of the fault-free pods run (tests/trainer/launcher/pods.py) every
    faulted pods run of its shape compares with (launcher/ and resilience/ tests alike)."""
    from tests.trainer.launcher import pods

    return pods.clean_run(tmp_path_factory)
