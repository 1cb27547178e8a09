"""A pytest plugin: the test process's fork server for NVRx's helpers, started before the collection.

Tests that save or abort with nvrx in the test process itself start NVRx's helpers there, and a rank's
helpers are forked from a fork server (trainer/checkpoint/helper_server.py); so are the tests'. The server
is forked only while the process runs one thread, and the collection starts one: importing aws_cdk (the
infra tests) starts jsii's kernel and its stderr reader thread. So it is started here, first thing in the
collection, where the selection reaches the trainer tests. Started later (a session fixture of the trainer
tests, as before), it was refused on that thread, and every in-process nvrx test spawned two interpreters
that import torch: test_ckpt_safety.py's nvrx tests took 13 s in the suite against 2.5 s alone.
Registered in tests/conftest.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

TRAINER_TESTS = Path(__file__).parent / "trainer"


@pytest.hookimpl(tryfirst=True)
def pytest_collection(session: pytest.Session) -> None:
    config = session.config
    if config.getoption("numprocesses", None) and not hasattr(config, "workerinput"):
        return  # xdist's controller: it runs no test
    if any(_reaches_trainer_tests(arg, config.rootpath) for arg in config.args):
        start()


def _reaches_trainer_tests(arg: str, root: Path) -> bool:
    path = (root / arg.split("::", 1)[0]).resolve()
    return path == TRAINER_TESTS or TRAINER_TESTS in path.parents or path in TRAINER_TESTS.parents


def start() -> None:
    """Import what the helpers run, then fork the server (nothing where one runs already)."""
    import nvidia_resiliency_ext.checkpointing.async_ckpt.filesystem_async  # noqa: F401
    import torch.distributed.checkpoint  # noqa: F401

    from trainer.checkpoint import helper_server, nvrx_async  # noqa: F401

    helper_server.start_here()
