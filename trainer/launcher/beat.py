"""The launcher's liveness beat for its node while its worker group starts (the worker side, the keys and
why: trainer/resilience/liveness.py).

After every rendezvous that made this node active (trainer/launcher/patches.py: `beat_after_rendezvous`
tells it when), a daemon thread in the launcher process writes a counter that changes with every write
under `trainer/liveness/<cycle>/<group rank>` in the rendezvous store, every `BEAT_INTERVAL_S`. The store
is the launcher's c10d TCPStore at `--rdzv-endpoint`, which outlives worker restarts. With the first beat
of a round it also writes where this pod's presence listener answers (`presence_key`,
trainer/launcher/presence.py), once: the workers of the round probe it when a collective fails.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from trainer.launcher.presence import presence_port
from trainer.resilience.liveness import (
    BEAT_INTERVAL_S,
    STANDBY_COUNT_KEY,
    join_endpoint,
    liveness_key,
    local_address_towards,
    presence_key,
    standby_key,
    store_client,
)

log = logging.getLogger(__name__)


def launcher_option(argv: list[str], *names: str) -> str | None:
    """The value of the first of ft_launcher's options `names` in `argv` (`--name value` or
    `--name=value`), if any."""
    for i, arg in enumerate(argv):
        for name in names:
            if arg == name and i + 1 < len(argv):
                return argv[i + 1]
            if arg.startswith(name + "="):
                return arg.split("=", 1)[1]
    return None


def rdzv_endpoint(argv: list[str]) -> str | None:
    """The value of ft_launcher's --rdzv-endpoint (or --rdzv_endpoint) in `argv`, if any."""
    return launcher_option(argv, "--rdzv-endpoint", "--rdzv_endpoint")


class LauncherBeat:
    """The launcher's beat for its node: `serve(cycle, group_rank)` after each rendezvous that made this
    node active, `pause()` when it enters the next one. While paused it beats under its standby slot
    instead (`standby_key`): a hot spare waits in the rendezvous for the whole run, and a straggler's node
    asks whether one does before it leaves (trainer/resilience/straggler.py). The thread starts with the
    first `pause` or `serve`."""

    def __init__(
        self,
        endpoint: str,
        interval_s: float = BEAT_INTERVAL_S,
        store_factory: Callable[[str], Any] = store_client,
        presence: int | None = None,
    ) -> None:
        """`presence`: the port of this pod's presence listener (trainer/launcher/presence.py); None:
        the one the supervisor exported (PRESENCE_PORT_ENV), if any."""
        self.endpoint = endpoint
        self.presence_port = presence if presence is not None else presence_port()
        self._presence: str | None = None
        """The key of this round's presence address, until it is written."""
        self.interval_s = interval_s
        self._store_factory = store_factory
        self._store: Any = None
        self._key: str | None = None
        self._count = 0
        self._lock = threading.Lock()
        self._io_lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._standby: str | None = None

    def serve(self, cycle: int, group_rank: int) -> None:
        with self._lock:
            self._key = liveness_key(cycle, group_rank)
            if self.presence_port is not None:
                self._presence = presence_key(cycle, group_rank)
        self._beat_once()  # before the workers start: a peer never sees this round's key missing
        self._start()

    def pause(self) -> None:
        with self._lock:
            self._key = None
        self._start()

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="trainer-liveness-beat", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        with self._lock:
            self._key = None
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._beat_once()

    def _beat_once(self) -> None:
        with self._lock:
            key = self._key
            self._count += 1
            count = self._count
            presence = self._presence
        # The store I/O runs outside _lock, so that pause() (the agent entering a rendezvous) never waits
        # for a connection to a store host that is gone; a beat already under way may still land under
        # the old key, which no worker of a later round reads.
        with self._io_lock:
            try:
                if self._store is None:
                    self._store = self._store_factory(self.endpoint)
                if key is None:  # in a rendezvous: a standby for as long as it waits there
                    if self._standby is None:
                        self._standby = standby_key(int(self._store.add(STANDBY_COUNT_KEY, 1)))
                    key = self._standby
                elif presence is not None:
                    self._publish_presence(presence)
                self._store.set(key, str(count))
            except Exception as exc:  # the store host is gone or slow: the job restarts anyway; try again
                log.debug("liveness beat %s failed: %s", key, exc)
                self._store = None

    def _publish_presence(self, key: str) -> None:
        """Where this pod's presence listener answers, for this round's peers: the address this host
        reaches the store from, which they reach the same store from too."""
        assert self.presence_port is not None
        self._store.set(key, join_endpoint(local_address_towards(self.endpoint), self.presence_port))
        with self._lock:
            if self._presence == key:
                self._presence = None
