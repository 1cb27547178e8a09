"""Who trained and who stood by: each local pod's rendezvous outcomes, read from its ft_launcher log.

NVRx >= 0.7's barrier rendezvous logs, per launcher and round, either "has joined the rendezvous 'ID' as
rank R in a world of size N" (an active node), "Standby (rank=R) for round K" (a hot spare), or, for a
launcher that arrived after the round closed, "Round K closed (training in progress), waiting for next
round" (a hot spare as well). A launcher that starts while training runs logs none of these: it syncs
to the current round and logs "attempts to join the next round of the rendezvous", then waits in
silence for a round to open; until it joins it is a spare too ("waiting"). The demo reads them to name
the pod that took a lost pod's place and the pod that became the new spare.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

_STAMP = r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) "
_JOINED = re.compile(_STAMP + r".*has joined the rendezvous '[^']*' as rank (\d+) in a world of size (\d+)")
_STANDBY = re.compile(_STAMP + r".*\] Standby \(rank=(\d+)\) for round (\d+)")
# A launcher that arrives after the round closed waits for the next one: a standby too (rank unknown).
_LATE = re.compile(_STAMP + r".*\] Round (\d+) closed \(training in progress\), waiting for next round")
_ATTEMPT = re.compile(_STAMP + r".*The node '[^']*' attempts to join the next round of the rendezvous")
# A launcher that just started (a new pod, or a lost pod's replacement): between rounds until one admits
# it. NVRx 0.7 logs nothing more for a standby until the next round opens, so without this line a
# replacement that stands by silently would keep the role its lost predecessor had (active).
_STARTED = re.compile(_STAMP + r".* Using nproc_per_node=\d+")


SPARE_ROLES = ("standby", "waiting")


@dataclass(frozen=True)
class RoleChange:
    """A pod's role from time `t` (unix seconds) on: "active" with its node rank, "standby" (a spare
    told so by the round), or "waiting" (a launcher between rounds: a survivor re-joining after a fault,
    or a spare that never joined a round)."""

    pod: str
    t: float
    role: str
    rank: int


def _unix(stamp: str) -> float:
    # Python logging writes local time; the demo reads it on the machine that wrote it.
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def role_changes(log_dir: Path) -> list[RoleChange]:
    """Every rendezvous outcome of every `pod-<index>.log` in `log_dir`, oldest first."""
    changes = []
    for path in sorted(log_dir.glob("pod-*.log")):
        pod = path.stem
        for line in path.read_text(errors="replace").splitlines():
            if m := _JOINED.match(line):
                changes.append(RoleChange(pod, _unix(m[1]), "active", int(m[2])))
            elif m := _STANDBY.match(line):
                changes.append(RoleChange(pod, _unix(m[1]), "standby", int(m[2])))
            elif m := _LATE.match(line):
                changes.append(RoleChange(pod, _unix(m[1]), "standby", -1))
            elif (m := _ATTEMPT.match(line)) or (m := _STARTED.match(line)):
                changes.append(RoleChange(pod, _unix(m[1]), "waiting", -1))
    return sorted(changes, key=lambda c: c.t)


def _roles_at(changes: list[RoleChange], t: float) -> dict[str, RoleChange]:
    latest: dict[str, RoleChange] = {}
    for c in changes:
        if c.t <= t:
            latest[c.pod] = c
    return latest


@dataclass(frozen=True)
class Takeover:
    """After a fault at `t_fault`: the spare that became active, and the pods on standby afterwards."""

    spare: str
    rank: int
    joined_after_s: float
    new_spares: tuple[str, ...]


def takeover_after(changes: list[RoleChange], t_fault: float) -> Takeover | None:
    """The pod that was a spare (standby or waiting) at `t_fault` and joined as an active node after it
    (None: no spare took over), with the pods standing by once training resumed."""
    before = _roles_at(changes, t_fault)
    for c in changes:
        if c.t > t_fault and c.role == "active" and before.get(c.pod, c).role in SPARE_ROLES:
            after = _roles_at(changes, max(x.t for x in changes))
            spares = tuple(sorted(p for p, r in after.items() if r.role in SPARE_ROLES and r.t > t_fault))
            return Takeover(c.pod, c.rank, c.t - t_fault, spares)
    return None


def active_at(changes: list[RoleChange], t: float, rank: int) -> str | None:
    """The pod that trained as node `rank` at time `t` (None: no log says so)."""
    for pod, c in sorted(_roles_at(changes, t).items()):
        if c.role == "active" and c.rank == rank:
            return pod
    return None
