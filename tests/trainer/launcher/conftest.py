"""The session's fault-free run of the pods harness (tests/trainer/launcher/pods.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.trainer.launcher.pods import clean_run


@pytest.fixture(scope="session")
def pods_clean_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    """(the record, the run directory) of the fault-free run every faulted pods run here compares with."""
    return clean_run(tmp_path_factory)
