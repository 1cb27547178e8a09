"""The pod's presence listener: a TCP port that the pod's main process keeps open for as long as it lives,
so that a peer can tell a pod that is gone from one that is merely failing.

A container dies whole: its main process ends and every process in it is killed with it (the kubelet's
rule; tools/localpod.py's too). So while this process (the supervisor, trainer/launcher/supervise.py,
PID 1 of the container) lives, so may the pod's workers; once a connection to its port is refused, the
process is gone, and with it every rank of the pod. The workers of the other pods use that, when a
collective of theirs fails, to record a lost pod's ranks as terminated at once instead of waiting for the
Wrapper's liveness timeout (trainer/resilience/lostpods.py).

The listener accepts a connection and closes it. It reads nothing and sends nothing: a connection that
succeeds says only "this port is open", which nobody trusts beyond "not known to be gone". Its port
reaches ft_launcher's process as PRESENCE_PORT_ENV; the launcher's beat publishes it with the address
peers reach this pod at (trainer/launcher/beat.py, the key `presence_key` of
trainer/resilience/liveness.py). The module is stdlib only: the supervisor never imports torch.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Mapping

PRESENCE_PORT_ENV = "TRAINER_PRESENCE_PORT"
"""The presence listener's port, in ft_launcher's environment (set by the supervisor)."""


class PresenceListener:
    """A listening socket on every address of this host (a free port), answered by a daemon thread."""

    def __init__(self) -> None:
        if socket.has_dualstack_ipv6():
            self._sock = socket.create_server(("", 0), family=socket.AF_INET6, dualstack_ipv6=True)
        else:
            self._sock = socket.create_server(("0.0.0.0", 0))
        self.port: int = self._sock.getsockname()[1]
        self._thread = threading.Thread(target=self._serve, name="trainer-presence", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:  # closed
                return
            conn.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        self._thread.join(timeout=1.0)


def presence_port(env: Mapping[str, str] | None = None) -> int | None:
    """The listener's port from PRESENCE_PORT_ENV, or None where no supervisor opened one."""
    value = (os.environ if env is None else env).get(PRESENCE_PORT_ENV, "")
    return int(value) if value.isdigit() and 0 < int(value) < 65536 else None
