"""`python -m tests.trainer.launcher.service_stub [--standby] --rdzv-endpoint=HOST:PORT`: a stand-in for
the rendezvous service's module under trainer/launcher/rendezvous.py's Keeper, with no torch to import:
as a standby it records its PID (`standby.<pid>` in STUB_DIR) and waits for its start; started, it
listens on the port once it is free (the service's own wait), records `serving.<pid>` and serves until
SIGTERM (exit 0)."""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from pathlib import Path

from trainer.launcher.rendezvous import _port, wait_port_free
from trainer.launcher.standby import STANDBY_FLAG, await_start, begin


def main(argv: list[str]) -> int:
    if argv[:1] != [STANDBY_FLAG]:
        return 3  # the Keeper starts every serving process through a standby
    out = Path(os.environ["STUB_DIR"])
    begin()
    (out / f"standby.{os.getpid()}").write_text("")
    command = await_start()
    port = _port(argv[1:])
    assert port is not None and wait_port_free(port, 10.0), "the port never came free"
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("0.0.0.0", port))
    listener.listen()
    (out / f"serving.{os.getpid()}").write_text(" ".join(command))
    stop: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, _frame: stop.append(signum))
    while not stop:
        time.sleep(0.05)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
