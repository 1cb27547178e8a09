"""Node liveness for a worker group that is starting: does every node of this round still have a launcher?

The gap it closes: when a node admitted to a rendezvous round is lost before its workers reach the
in-process Wrapper's initial barrier (a hot spare killed while it joins), the survivors' new workers wait
in that barrier for ranks that will never come, for a whole `inprocess_barrier_timeout` (minutes with the
chart's defaults). Nothing else notices: NVRx 0.7's barrier rendezvous sends no keep-alives once a round
is closed, the Wrapper's monitor-process heartbeats start only after the barrier, and the launchers
watch only their own workers.

So each launcher beats for its node (trainer/launcher/beat.py, run inside ft_launcher by
trainer/launcher/ft.py), and a worker waiting in the initial barrier watches the beats of every node of its
round (this module: the keys both sides use, and the worker's watch):

* `LauncherBeat` (launcher side, trainer/launcher/beat.py): after every rendezvous that made this node
  active, a daemon thread writes `trainer/liveness/<cycle>/<group rank>` in the rendezvous store (the
  launcher's c10d TCPStore, which outlives worker restarts) every `BEAT_INTERVAL_S`, a counter that
  changes with every write.
  The cycle is NVRx's rendezvous round, which the workers get as TORCHELASTIC_RESTART_COUNT.
* `RoundWatch` (worker side): a watcher (local rank 0 of group ranks 0 and 1) reads those keys for
  every group rank of the round and finds a node lost when its key has not changed for the liveness
  timeout, or has not appeared that long after the watch began (the node was lost before its launcher
  could write once); it writes its finding under `trainer/liveness/<cycle>/lost`, which every worker of
  the round polls, and each raises `NodeLost`. Store load: the watchers read N keys a poll, every worker
  one, so a round of 1,000 nodes x 8 ranks costs the store host about 10,000 small reads a second
  while its workers start.

Change, not wall-clock time, is what counts, so clocks that differ between nodes do not matter. A node
that is merely slow to start its workers keeps beating (its launcher is up), so a slow cold start is
never mistaken for a lost node; only the barrier timeout bounds that.

The store's address reaches the workers as TRAINER_LIVENESS_STORE (host:port, the launcher's
`--rdzv-endpoint`); without it (plain `python -m trainer`, torchrun, the plain ft_launcher script)
`RoundWatch.from_env` returns None and the barrier waits as NVRx ships it.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

log = logging.getLogger(__name__)

LIVENESS_STORE_ENV = "TRAINER_LIVENESS_STORE"
BEAT_INTERVAL_S = 1.0
"""How often a launcher beats. A worker declares a node lost after its liveness timeout (> this)."""
WATCHER_NODES = 2
"""Local rank 0 of group ranks 0 .. WATCHER_NODES-1 reads every node's beat; the others read one key."""
STORE_TIMEOUT_S = 5.0
"""Per-operation timeout of the liveness store clients: a store host that is gone fails a call fast."""


class NodeLost(RuntimeError):
    """A node of this rendezvous round stopped beating before its workers joined: restart the group."""


def liveness_key(cycle: int, group_rank: int) -> str:
    return f"trainer/liveness/{cycle}/{group_rank}"


def lost_key(cycle: int) -> str:
    """Set by a watcher, with its one-line finding, once a node of round `cycle` is lost."""
    return f"trainer/liveness/{cycle}/lost"


STANDBY_COUNT_KEY = "trainer/standby/count"
"""Incremented once by each launcher process when it first waits in a rendezvous: its standby slot."""


def standby_key(slot: int) -> str:
    """A launcher waiting in a rendezvous (a hot spare, while the job trains) writes a changing counter
    here every BEAT_INTERVAL_S; it stops once a round makes its node active."""
    return f"trainer/standby/{slot}"


def spare_standing_by(
    store: Any, wait_s: float = 1.5 * BEAT_INTERVAL_S, sleep: Callable[[float], None] = time.sleep
) -> bool:
    """Whether a hot spare's launcher waits in the rendezvous now: a standby counter that changes within
    `wait_s` (a launcher that died or became active leaves its counter standing). Reads every slot twice;
    asked only by a straggler's node about to be evicted, never per step."""
    slots = int(store.add(STANDBY_COUNT_KEY, 0))
    keys = [standby_key(i) for i in range(1, slots + 1)]

    def values() -> dict[str, bytes]:
        return {k: bytes(store.get(k)) for k in keys if store.check([k])}

    before = values()
    if not before:
        return False
    sleep(wait_s)
    after = values()
    return any(after.get(k) != v for k, v in before.items())


def presence_key(cycle: int, group_rank: int) -> str:
    """`host:port` of the presence listener of the pod that holds `group_rank` in round `cycle`
    (trainer/launcher/presence.py), written by its launcher next to its beat; read by
    trainer/resilience/lostpods.py when a fault may have been a lost pod."""
    return f"trainer/liveness/{cycle}/presence/{group_rank}"


def local_address_towards(endpoint: str) -> str:
    """The address this host sends from to reach `endpoint` (host:port): the one its peers, which reach
    the same store, can reach it at. Nothing is sent (a UDP socket's connect only picks the route)."""
    import socket

    host, port = parse_endpoint(endpoint)
    family, _, _, _, sockaddr = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        sock.connect(sockaddr)
        return str(sock.getsockname()[0])


def join_endpoint(host: str, port: int) -> str:
    """The inverse of parse_endpoint: `host:port`, an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_endpoint(endpoint: str, field_name: str = LIVENESS_STORE_ENV) -> tuple[str, int]:
    """`host:port` (the launcher's --rdzv-endpoint form) -> (host, port); ValueError naming the field."""
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{field_name}: expected host:port, got {endpoint!r}")
    return host.strip("[]"), int(port)


def store_client(endpoint: str) -> Any:
    """A client of the liveness store (the launcher's rendezvous TCPStore) at `endpoint`."""
    import torch.distributed as dist

    host, port = parse_endpoint(endpoint)
    return dist.TCPStore(
        host, port, is_master=False, timeout=timedelta(seconds=STORE_TIMEOUT_S), wait_for_workers=False
    )


@dataclass
class RoundWatch:
    """A worker's view of its round's node beats (see the module docstring).

    Only the first local rank of the first WATCHER_NODES nodes reads every node's beat (with thousands of
    nodes, every rank doing so would put millions of reads a second on the store host); a watcher that
    finds a node lost says so under `lost_key(cycle)`, and every worker of the round looks at that one
    key. Two watcher nodes, so that losing one of them still leaves a watcher."""

    store: Any
    cycle: int
    group_world_size: int
    own_group_rank: int
    timeout_s: float
    watches_nodes: bool = True
    clock: Callable[[], float] = time.monotonic
    _seen: dict[int, tuple[bytes | None, float]] = field(default_factory=dict, init=False)
    """Per peer group rank: its last value seen and when it last changed (or the watch began)."""
    _started: float = field(default=-1.0, init=False)

    @classmethod
    def from_env(cls, timeout_s: float, env: Mapping[str, str] | None = None) -> RoundWatch | None:
        """The watch for this worker's round, or None outside trainer.launcher.ft."""
        env = os.environ if env is None else env
        endpoint = env.get(LIVENESS_STORE_ENV)
        if not endpoint:
            return None
        try:
            cycle = int(env["TORCHELASTIC_RESTART_COUNT"])
            group_world_size = int(env["GROUP_WORLD_SIZE"])
            own = int(env["GROUP_RANK"])
            watches = int(env.get("LOCAL_RANK", "0")) == 0 and own < WATCHER_NODES
            store = store_client(endpoint)
        except Exception as exc:  # not under a launcher after all, or its store is gone: NVRx's own wait
            log.warning("node liveness off for this start: %s", exc)
            return None
        return cls(store, cycle, group_world_size, own, timeout_s, watches_nodes=watches)

    def check(self) -> None:
        """Raise NodeLost if a watcher said a node of this round is lost, or (as a watcher) if a peer
        node's beat has stood still, or stayed missing, for timeout_s."""
        verdict = lost_key(self.cycle)
        if self.store.check([verdict]):
            raise NodeLost(self.store.get(verdict).decode(errors="replace"))
        if not self.watches_nodes:
            return
        message = self._lost_node()
        if message is not None:
            try:
                self.store.set(verdict, message)
            except Exception as exc:  # the other workers then find out through their barrier timeout
                log.warning("could not publish the lost node: %s", exc)
            raise NodeLost(message)

    def _lost_node(self) -> str | None:
        now = self.clock()
        if self._started < 0:
            self._started = now
        for group_rank in range(self.group_world_size):
            if group_rank == self.own_group_rank:
                continue
            key = liveness_key(self.cycle, group_rank)
            value = self.store.get(key) if self.store.check([key]) else None
            if group_rank not in self._seen:
                # A beat seen for the first time counts from now; a missing one from the watch's start.
                self._seen[group_rank] = (value, now if value is not None else self._started)
            last_value, since = self._seen[group_rank]
            if value != last_value:
                self._seen[group_rank] = (value, now)
            elif now - since >= self.timeout_s:
                state = "never beat" if value is None else "stopped beating"
                return (
                    f"node with group rank {group_rank} of rendezvous round {self.cycle} {state} for "
                    f"{now - since:.1f} s (liveness timeout {self.timeout_s} s): restarting the worker group"
                )
        return None
