"""Shared fixtures: free ports and the repository root."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago (never a fixed port shared between tests)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def repo_root() -> Path:
    return REPO_ROOT
