"""A lost pod noticed in a fraction of a second: when a fault interrupts the Wrapper, ask the pods of this
round whether they are still there, and record the ranks of a pod that is gone as terminated.

Why: NVRx learns that a rank is dead from the rank's monitor process (it records the rank's end when its
process ends) or, failing that, from the missing heartbeats of that monitor after the Wrapper's liveness
timeout (`inprocess_liveness_timeout`, seconds). A container dies whole, its monitor processes with it,
so on Kubernetes a lost pod always cost the survivors the whole liveness timeout, although their
collective failed the moment its sockets closed ("Connection closed by peer").

How: every pod's main process keeps a presence listener open (trainer/launcher/presence.py) and its
launcher publishes the listener's address for the round (`presence_key`, trainer/resilience/liveness.py).
When the Wrapper aborts an iteration (inprocess.py: `LostPodWatch`, run by NVRx's monitor thread on every
rank), local rank 0 of each node probes the next PROBED_SUCCESSORS nodes of the round (group ranks g+1,
g+2, mod the round's size) every PROBE_INTERVAL_S, until the Wrapper's iteration barrier is complete (every
rank arrived, or was recorded terminated) or the liveness timeout would have acted anyway. Each probe has
three outcomes:

* refused: nothing listens at the address, so the pod's main process is gone, and with it (a container
  dies whole) every rank of the pod: its ranks are recorded terminated, exactly as NVRx's own monitors
  record a dead rank, and the survivors leave for tier 2 at once;
* answered: the pod is there (a tier-1 exception closes sockets too, while its pod lives); nothing is
  recorded. Probing goes on, since a pod that is being killed may still answer for a moment;
* anything else (a timeout, an unreachable host, no address published): unknown; nothing is recorded,
  and the liveness timeout decides as before. A node that vanishes from the network (its packets
  dropped) is noticed only that way.

Nothing is read from a probe connection: it is opened and closed. Only a refusal acts, and a refusal
never comes from a live pod's listener; a wrong address could produce one, so an address on the
loopback is probed only by a prober that reaches the store over the loopback too (the same host).

Ranks of a node: ft_launcher runs identical workers (TORCH_ELASTIC_WORKER_IDENTICAL), so the node with
group rank g holds global ranks g*L .. g*L+L-1 (L = LOCAL_WORLD_SIZE), whichever pod holds g in this
round: hot spares take a group rank when a round makes them active, and NVRx may move survivors to
other group ranks between rounds (docs/nvrx-group-rank-shift.md), which is why every key is per round.
`RoundLayout.from_env` checks that formula against this worker's own RANK and WORLD_SIZE and turns the
probe off where it does not hold. The Wrapper's ranks are the global ranks: FixedWorld never renumbers.
"""

from __future__ import annotations

import enum
import ipaddress
import logging
import os
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from trainer.resilience.liveness import parse_endpoint

log = logging.getLogger(__name__)

PROBE_INTERVAL_S = 0.1
"""How often a prober asks its nodes again while the fault is handled."""
PROBE_TIMEOUT_S = 0.25
"""How long one connection attempt may take before its answer is "unknown"."""
PROBED_SUCCESSORS = 2
"""Each node probes this many nodes after it in the round: a run of up to this many consecutive lost
nodes is noticed at once; longer runs wait for the liveness timeout."""


class Presence(enum.Enum):
    GONE = "refused"
    THERE = "answered"
    UNKNOWN = "unknown"


def probe(address: str, timeout_s: float = PROBE_TIMEOUT_S) -> Presence:
    """Connect to `address` (host:port) and close at once: refused -> GONE, connected -> THERE, anything
    else -> UNKNOWN. Nothing is read or sent."""
    try:
        host, port = parse_endpoint(address, "presence address")
        with socket.create_connection((host, port), timeout=timeout_s):
            return Presence.THERE
    except ConnectionRefusedError:
        return Presence.GONE
    except (OSError, ValueError):
        return Presence.UNKNOWN


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def probe_allowed(address: str, own_host: str) -> bool:
    """Whether a refusal at `address` can be trusted from a prober that reaches the store from
    `own_host`: a loopback address means "the publisher's own host", the prober's only if it is on the
    loopback too."""
    try:
        host, _ = parse_endpoint(address, "presence address")
    except ValueError:
        return False
    return not _is_loopback(host) or _is_loopback(own_host)


@dataclass(frozen=True)
class RoundLayout:
    """Where this worker sits in its rendezvous round, and which global ranks each node holds."""

    cycle: int
    group_rank: int
    group_world_size: int
    local_world_size: int
    local_rank: int

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> RoundLayout | None:
        """The layout from ft_launcher's worker environment; None when a variable is missing or the
        identical-workers formula does not give this worker's own RANK and WORLD_SIZE."""
        env = os.environ if env is None else env
        try:
            layout = cls(
                cycle=int(env["TORCHELASTIC_RESTART_COUNT"]),
                group_rank=int(env["GROUP_RANK"]),
                group_world_size=int(env["GROUP_WORLD_SIZE"]),
                local_world_size=int(env["LOCAL_WORLD_SIZE"]),
                local_rank=int(env["LOCAL_RANK"]),
            )
            rank, world_size = int(env["RANK"]), int(env["WORLD_SIZE"])
        except (KeyError, ValueError):
            return None
        if layout.local_world_size < 1 or not 0 <= layout.group_rank < layout.group_world_size:
            return None
        if world_size != layout.group_world_size * layout.local_world_size:
            return None
        if rank != layout.ranks_of(layout.group_rank)[layout.local_rank]:
            return None
        return layout

    def ranks_of(self, group_rank: int) -> range:
        """The global ranks of the node with `group_rank` in this round."""
        first = group_rank * self.local_world_size
        return range(first, first + self.local_world_size)

    def probed_nodes(self, successors: int = PROBED_SUCCESSORS) -> list[int]:
        """The group ranks this node probes: the next `successors` after it, never itself."""
        count = min(successors, self.group_world_size - 1)
        return [(self.group_rank + i) % self.group_world_size for i in range(1, count + 1)]


@dataclass
class LostPodProbe:
    """One fault's probing (see the module docstring): `run()` returns the group ranks found gone.

    `address(g)` is node g's published presence address (None: not known); `record(ranks)` records
    global ranks terminated; `settled()` is true once the Wrapper's iteration barrier is complete."""

    layout: RoundLayout
    own_host: str
    address: Callable[[int], str | None]
    record: Callable[[list[int]], None]
    settled: Callable[[], bool]
    deadline_s: float
    interval_s: float = PROBE_INTERVAL_S
    probe: Callable[[str], Presence] = probe
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep

    def run(self) -> list[int]:
        targets = self.layout.probed_nodes()
        addresses: dict[int, str] = {}
        gone: list[int] = []
        deadline = self.clock() + self.deadline_s
        while targets and not self.settled() and self.clock() < deadline:
            for group_rank in list(targets):
                if group_rank not in addresses:
                    found = self.address(group_rank)
                    if found is None or not probe_allowed(found, self.own_host):
                        continue
                    addresses[group_rank] = found
                if self.probe(addresses[group_rank]) is Presence.GONE:
                    ranks = list(self.layout.ranks_of(group_rank))
                    log.warning(
                        "the pod of node %d (ranks %s) is gone (%s refused): recording its ranks terminated",
                        group_rank,
                        ranks,
                        addresses[group_rank],
                    )
                    self.record(ranks)
                    gone.append(group_rank)
                    targets.remove(group_rank)
            if targets:
                self.sleep(self.interval_s)
        return gone
