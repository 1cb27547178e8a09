"""Free TCP ports for local runs (a trainer started without a launcher, the local pods, tests and
benchmarks), chosen where no outgoing connection can take them.

A port the kernel hands out for `bind(0)` comes from the ephemeral range, the same range every outgoing
connection's local side is drawn from. Between picking such a port and a trainer binding it (and the
trainer binds `port+1` and `port+2` too: its process-group and in-process stores), any client socket on
the machine may take it: `EADDRINUSE`, seen in CI. Below the ephemeral range only a listener can hold a
port, so a port found free there stays free unless another local run picks it as well.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_LOWEST = 10_000  # well above the ports system services listen on
_ATTEMPTS = 200


def _ephemeral_start() -> int:
    """First port of the kernel's ephemeral range (Linux default 32768; 49152 elsewhere)."""
    try:
        return int(_RANGE_FILE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(port: int, host: str) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def free_port(span: int = 3, host: str = "127.0.0.1") -> int:
    """A port p, below the ephemeral range, with p .. p+span-1 all free on `host` a moment ago.

    The default span covers the trainer's stores at MASTER_PORT+1 and +2 (trainer/resilience/timeouts.py).
    """
    top = _ephemeral_start() - span
    if top <= _LOWEST:
        raise RuntimeError(f"no port range below the ephemeral range {_ephemeral_start()} to pick from")
    rng = random.SystemRandom()
    for _ in range(_ATTEMPTS):
        port = rng.randrange(_LOWEST, top)
        if all(_bindable(port + i, host) for i in range(span)):
            return port
    raise RuntimeError(f"no {span} free consecutive ports found in {_ATTEMPTS} tries")
