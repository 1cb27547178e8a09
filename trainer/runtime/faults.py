"""Deterministic fault injection, off by default.

A fault is `KIND:step=N[:rank=R][:node=K][:factor=F]` given with `--fault` (repeatable) or in TRAINER_FAULTS
(';'-separated). `rank=random` draws the rank from `--fault-seed`, so a run is reproducible. Each fault
fires at most once per run, even across restarts: the firing rank first creates a marker file under
`<out-dir>/faults/` with O_EXCL, then fires; a restarted process finds the marker and skips it. A node-loss
has one marker per node: it fires on the node's ranks of the round that claimed it, never in a later one.

Kinds and where they fire (rank R defaults to 0, node K to 0):
    exception     rank R raises InjectedFault at the start of step N        (tier 1)
    sigkill       rank R sends itself SIGKILL at the start of step N        (tier 2)
    hang          rank R loops in Python at the start of step N             (tier 1 soft timeout / tier 2)
    stop          rank R sends itself SIGSTOP at the start of step N        (tier 2: a frozen process)
    node-loss     every rank of node K (GROUP_RANK) kills its launcher agent's process group, i.e. the pod
    ckpt-crash    rank R is killed inside the first checkpoint save of step >= N, after its shard is
                  durable and before the commit (through CheckpointHooks.before_commit)
    ckpt-corrupt  at the start of step N rank R corrupts the newest committed checkpoint, then is killed
    ckpt-write-error  rank R's write of the first checkpoint save of step >= N fails (as a full disk or
                  a storage error would: through CheckpointHooks.after_write); training goes on
    repeat-exception  rank R raises InjectedFault at the start of step N on every attempt, like a
                  deterministic bug (no marker): what the repeated-fault bound (--max-repeated-faults) stops
    snapshot-corrupt  at the start of step N rank R flips bytes in its newest host-memory snapshot (its
                  /dev/shm slot), then is killed: its restart finds the copy damaged and takes the next
                  source (the peer's replica, the NVMe or the durable checkpoint)
    replica-corrupt  from the start of step N the rank keeping rank R's peer replica damages every
                  replica of R it holds and receives (memory gone bad at rest); a node loss of R's node
                  then needs it (add `node-loss:step=M:node=K`, M > N)
    slow          from step N on, rank R (or, with node=K, every rank of node K) is `factor` times slower:
                  after its step it sleeps (F - 1) x the step's own time (trainer/resilience/straggler.py
                  finds it). Bound to the pod that first fired it (its marker names the pod), so the spare
                  that takes the node's place after an eviction is not slow.
    nan           in step N rank R's gradients (in the optimizer's step, so the update really is NaN)
                  and the loss it logs become NaN: what the numerical guard rolls back
    spike         in step N rank R's gradients and logged loss are multiplied by `factor` (default 1000)
"""

from __future__ import annotations

import math
import os
import random
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, cast, get_args

FaultKind = Literal[
    "exception",
    "sigkill",
    "hang",
    "stop",
    "node-loss",
    "ckpt-crash",
    "ckpt-corrupt",
    "ckpt-write-error",
    "repeat-exception",
    "snapshot-corrupt",
    "replica-corrupt",
    "slow",
    "nan",
    "spike",
]
NUMERIC_KINDS = ("nan", "spike")  # armed at the start of the step, applied to its gradients and loss
SPIKE_FACTOR = 1000.0
"""A spike's `factor` when the spec gives none: far past any sensible --guard-spike-factor."""
IN_SAVE_KINDS = ("ckpt-crash", "ckpt-write-error")  # fire inside a save, not at the start of a step
FAULT_KINDS: tuple[str, ...] = get_args(FaultKind)
RANDOM = -1  # rank=random before it is resolved


class InjectedFault(RuntimeError):
    """The exception raised by an `exception` fault (tier 1 recovers from it)."""


class InjectedWriteError(OSError):
    """The write failure of a `ckpt-write-error` fault (the save fails; training goes on)."""


@dataclass(frozen=True)
class FaultSpec:
    """One parsed fault: kind, the global step where it fires, and which rank or node fires it."""

    kind: FaultKind
    step: int
    rank: int = 0
    node: int = 0
    factor: float | None = None
    """`slow`: how many times slower its ranks are (> 1, required); `spike`: what the step's gradients and
    loss are multiplied by (None: SPIKE_FACTOR). None for every other kind."""
    by_node: bool = False
    """A `slow` fault given with node=K (every rank of the node), not rank=R."""

    @property
    def key(self) -> str:
        """Stable name of the fault, used for its once-per-run marker file."""
        return f"{self.kind}-step{self.step}-rank{self.rank}-node{self.node}"

    def __str__(self) -> str:
        if self.kind == "slow":
            who = f"node={self.node}" if self.by_node else f"rank={self.rank}"
            return f"slow:step={self.step}:{who}:factor={self.factor:g}"
        extra = f":factor={self.factor}" if self.factor is not None else ""
        return f"{self.kind}:step={self.step}:rank={self.rank}:node={self.node}{extra}"


def parse_fault(text: str) -> FaultSpec:
    """Parse `KIND:step=N[:rank=R|random][:node=K]`; raise ValueError saying what is wrong."""
    if any(ch.isspace() or not ch.isprintable() for ch in text):  # a YAML block scalar's trailing newline
        raise ValueError(
            f"{text!r} holds whitespace or control characters; write KIND:step=N[:rank=R][:node=K]"
        )
    parts = text.split(":")
    kind = parts[0]
    if kind not in FAULT_KINDS:
        raise ValueError(f"unknown kind {kind!r} in {text!r}; choose one of {', '.join(FAULT_KINDS)}")
    fields: dict[str, str] = {}
    for part in parts[1:]:
        name, sep, value = part.partition("=")
        if not sep or name not in ("step", "rank", "node", "factor") or name in fields:
            raise ValueError(
                f"bad part {part!r} in {text!r}; expected step=N, rank=R|random, node=K, factor=F once each"
            )
        fields[name] = value
    if "step" not in fields:
        raise ValueError(f"{text!r} needs step=N")
    if kind == "slow" and "factor" not in fields:
        raise ValueError(f"factor: slow needs factor=F in {text!r}")
    if kind == "slow" and "rank" in fields and "node" in fields:
        raise ValueError(f"node: slow takes rank=R or node=K, not both, in {text!r}")

    def as_int(name: str, low: int) -> int:
        raw = fields[name].lstrip("-")
        if not (raw.isascii() and raw.isdigit()):  # int() would also take fullwidth digits, "1_0" and " 3"
            raise ValueError(f"{name} must be an integer in {text!r}, got {fields[name]!r}")
        value = int(fields[name])
        if value < low:
            raise ValueError(f"{name} must be >= {low} in {text!r}, got {value}")
        return value

    rank = RANDOM if fields.get("rank") == "random" else as_int("rank", 0) if "rank" in fields else 0
    node = as_int("node", 0) if "node" in fields else 0
    factor = _factor(kind, fields["factor"], text) if "factor" in fields else None
    return FaultSpec(
        kind=cast(FaultKind, kind),
        step=as_int("step", 0),
        rank=rank,
        node=node,
        factor=factor,
        by_node=kind == "slow" and "node" in fields,
    )


SLOW_FACTOR_MAX = 100.0


def _factor(kind: str, raw: str, text: str) -> float:
    """A `factor=F`: for slow a plain decimal number (no exponent, sign, inf or nan), 1 < F <= 100; for
    spike a finite number > 1 (a factor of a kind that takes none is refused)."""
    if kind == "slow":
        digits = raw.replace(".", "", 1)
        if not (raw and digits and digits.isascii() and digits.isdigit()):
            raise ValueError(f"factor must be a decimal number in {text!r}, got {raw!r}")
        value = float(raw)
        if not 1.0 < value <= SLOW_FACTOR_MAX:
            raise ValueError(f"factor must be > 1 and <= {SLOW_FACTOR_MAX:g} in {text!r}, got {raw}")
        return value
    if kind != "spike":
        raise ValueError(f"factor applies to slow and spike only, not {kind} in {text!r}")
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"factor must be a number in {text!r}, got {raw!r}") from None
    if not (math.isfinite(value) and value > 1):
        raise ValueError(f"factor must be a finite number > 1 in {text!r}, got {raw!r}")
    return value


def resolve_ranks(specs: Sequence[FaultSpec], world_size: int, seed: int) -> list[FaultSpec]:
    """Replace rank=random by a rank drawn from `seed` (same seed, same ranks); check ranks exist."""
    rng = random.Random(seed)
    out = []
    for spec in specs:
        rank = rng.randrange(world_size) if spec.rank == RANDOM else spec.rank
        if rank >= world_size:
            raise ValueError(
                f"{spec.kind}:step={spec.step}: rank {rank} does not exist (world size {world_size})"
            )
        out.append(FaultSpec(spec.kind, spec.step, rank, spec.node, spec.factor, spec.by_node))
    return out


class FaultInjector:
    """Fires the faults of one rank. `emit(fault, step)` records `fault_injected` just before firing."""

    def __init__(
        self,
        specs: Sequence[FaultSpec],
        *,
        rank: int,
        node: int,
        marker_dir: Path,
        emit: Callable[[str, int], object],
    ) -> None:
        self.rank, self.node = rank, node
        self.marker_dir = marker_dir
        self.emit = emit
        self.specs = [s for s in specs if self._targets_me(s)]
        self._slow_pods: dict[str, bool] = {}
        self.armed: FaultSpec | None = None
        """The nan or spike fault of the step in progress (`numeric`), claimed at its start."""

    def _targets_me(self, spec: FaultSpec) -> bool:
        if spec.kind == "node-loss" or spec.by_node:
            return spec.node == self.node
        if spec.kind == "replica-corrupt":
            return True  # fired by whichever rank keeps R's replica (at_step's `damage_replicas` says)
        return spec.rank == self.rank

    def slow_factor(self, step: int) -> float:
        """How many times slower this rank is at `step` (1.0: not slow). A slow fault holds from its step
        on for the pod that first fired it: its marker names that pod (`pod_identity`), and a rank of
        another pod (the spare that took the node's place) finds someone else's marker and is not slow.
        The rank that claims it first emits `fault_injected`."""
        factor = 1.0
        for spec in self.specs:
            if spec.kind != "slow" or step < spec.step:
                continue
            mine = self._slow_pods.get(spec.key)
            if mine is None:
                mine, first = self._claim_slow(spec)
                self._slow_pods[spec.key] = mine
                if first:  # once per run, not again from a restarted process of the same pod
                    self.emit(spec.kind, step)
            if mine:
                factor = max(factor, spec.factor or 1.0)
        return factor

    def _claim_slow(self, spec: FaultSpec) -> tuple[bool, bool]:
        """(this pod is the slow one, this call made it so)."""
        self.marker_dir.mkdir(parents=True, exist_ok=True)
        path = self.marker_dir / f"{spec.key}-node{self.node}"
        pod = pod_identity()
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_text(pod, encoding="ascii")
        try:
            os.link(tmp, path)  # whole or absent: a neighbour rank never reads a half-written marker
        except FileExistsError:
            return path.read_text(encoding="ascii", errors="replace").strip() == pod, False
        finally:
            tmp.unlink()
        return True, True

    def _claim(self, spec: FaultSpec) -> bool:
        """True once per run: create the marker file exclusively (a restarted process finds it).

        A node-loss has one marker per node, written by whichever rank of the node gets there first, with
        the launcher round it fired in. The node's other ranks of that same round fire too (the pod is
        going down with all of them anyway); the ranks that hold node K's place in a later round (a spare,
        a replacement pod) find another round in the marker and do not fire again. A marker per rank fired
        twice: the first rank killed the pod before its neighbour wrote its own, and the neighbour's
        successor in the next round found none.
        """
        self.marker_dir.mkdir(parents=True, exist_ok=True)
        path = self.marker_dir / spec.key
        round_id = _launcher_round() if spec.kind == "node-loss" else None
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return round_id is not None and _marker_round(path) == round_id
        os.write(fd, f"{time.time()} pid={os.getpid()} round={round_id}\n".encode())
        os.fsync(fd)
        os.close(fd)
        return True

    def at_step(
        self,
        step: int,
        *,
        corrupt_newest: Callable[[], object] | None = None,
        corrupt_snapshot: Callable[[], object] | None = None,
        damage_replicas: Callable[[int], object] | None = None,
        keeps_replica_of: Callable[[int], bool] | None = None,
    ) -> None:
        """Fire every step fault due at the start of `step` on this rank (ckpt-crash is not one).
        `keeps_replica_of(R)`: this rank keeps R's peer replica (a replica-corrupt fires there). Arms a
        nan or spike fault of `step` for `numeric`."""
        self.armed = None
        for spec in self.specs:
            if spec.kind == "repeat-exception" and spec.step == step:
                self.emit(spec.kind, step)
                raise InjectedFault(f"injected {spec} (every attempt)")
            if spec.kind == "replica-corrupt" and not (keeps_replica_of and keeps_replica_of(spec.rank)):
                continue
            if spec.kind in (*IN_SAVE_KINDS, "slow") or spec.step != step or not self._claim(spec):
                continue
            self.emit(spec.kind, step)
            if spec.kind in NUMERIC_KINDS:
                self.armed = spec
            elif spec.kind == "exception":
                raise InjectedFault(f"injected {spec}")
            if spec.kind == "replica-corrupt":
                if damage_replicas is not None:
                    damage_replicas(spec.rank)
            elif spec.kind in ("ckpt-corrupt", "snapshot-corrupt"):
                corrupt = corrupt_newest if spec.kind == "ckpt-corrupt" else corrupt_snapshot
                if corrupt is not None:
                    corrupt()
                _kill_self(signal.SIGKILL)
            elif spec.kind == "sigkill":
                _kill_self(signal.SIGKILL)
            elif spec.kind == "stop":
                _kill_self(signal.SIGSTOP)
            elif spec.kind == "hang":
                _hang()
            elif spec.kind == "node-loss":
                _lose_node()

    def numeric(self, step: int) -> float | None:
        """What a nan or spike fault armed for `step` multiplies this rank's gradients and loss by (NaN
        for nan), or None: applied by the numerical guard's hooks (trainer/resilience/guard.py)."""
        spec = self.armed
        if spec is None or spec.step != step:
            return None
        if spec.kind == "nan":
            return math.nan
        return spec.factor if spec.factor is not None else SPIKE_FACTOR

    def in_checkpoint(self, step: int) -> None:
        """CheckpointHooks.before_commit: die inside the first save at or after a ckpt-crash step."""
        for spec in self.specs:
            if spec.kind == "ckpt-crash" and step >= spec.step and self._claim(spec):
                self.emit(spec.kind, step)
                _kill_self(signal.SIGKILL)

    def in_write(self, step: int) -> None:
        """CheckpointHooks.after_write: fail this rank's write of the first save at or after the step."""
        for spec in self.specs:
            if spec.kind == "ckpt-write-error" and step >= spec.step and self._claim(spec):
                self.emit(spec.kind, step)
                raise InjectedWriteError(28, f"injected {spec}: no space left on device")


def _launcher_round() -> str:
    """The launcher round this process belongs to: its launcher process (TRAINER_LAUNCHER_ID, set by
    trainer/launcher/ft.py) and that launcher's round (TORCHELASTIC_RESTART_COUNT, 0 outside a
    launcher). The count alone is not enough: it starts at 0 again in a launcher started anew (a
    replaced rendezvous service, a killed launcher), and a replacement pod's round 0 then matched the
    round the marker was written in (seen: a node loss fired twice)."""
    from trainer.launcher.supervise import LAUNCHER_ID_ENV

    launcher = os.environ.get(LAUNCHER_ID_ENV, "")
    count = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return f"{launcher}/{count}" if launcher else count


def pod_identity() -> str:
    """This process's pod: its host name and the pod's main process (the supervisor, or else the launcher
    agent), which outlive worker restarts and launcher restarts within the pod, and differ between pods
    (several local pods share one host)."""
    import socket

    from trainer.launcher.supervise import SUPERVISOR_PID_ENV

    main = os.environ.get(SUPERVISOR_PID_ENV, "") or str(os.getppid())
    return f"{socket.gethostname()}/{main}"


def _marker_round(path: Path) -> str | None:
    """The `round=` a marker was written in; None when it cannot be read (a marker of another format)."""
    try:
        text = path.read_text(encoding="ascii", errors="replace")
    except OSError:
        return None
    for part in text.split():
        if part.startswith("round="):
            return part.removeprefix("round=")
    return None


def _kill_self(sig: signal.Signals) -> None:
    os.kill(os.getpid(), sig)
    # SIGSTOP returns when continued; SIGKILL never returns. Either way there is nothing left to do here.


def _hang() -> None:
    """Stuck in Python (not in C): the Wrapper's async exception can still interrupt it."""
    while True:
        time.sleep(0.05)


def _lose_node() -> None:
    """Kill this pod: its launcher agent with every worker, as when a node disappears.

    Only under a launcher (TORCHELASTIC_RUN_ID set) and only when the agent leads its own process group
    (LocalPod and Kubernetes containers start it that way): otherwise the group could be a test runner's,
    and only this process dies.
    """
    from trainer.launcher.prefork import launcher_pid
    from trainer.launcher.supervise import SUPERVISOR_PID_ENV

    agent = launcher_pid()  # a prefork worker's parent is the pod's zygote, not the launcher
    supervisor = os.environ.get(SUPERVISOR_PID_ENV, "")
    if supervisor.isdigit() and int(supervisor) > 1:
        agent = int(supervisor)  # the pod's main process, which leads the pod's process group
    if os.environ.get("TORCHELASTIC_RUN_ID") and agent > 1:
        try:
            if os.getpgid(agent) == agent:
                os.killpg(agent, signal.SIGKILL)
            else:
                os.kill(agent, signal.SIGKILL)
        except ProcessLookupError:
            pass
    _kill_self(signal.SIGKILL)


def corrupt_checkpoint(newest: Path | None, local_root: Path | None) -> None:
    """ckpt-corrupt: make the newest committed checkpoint `newest` unreadable (flip bytes in its largest
    file), in both tiers: the node-local copy of that file under `local_root` too, if this node has it.

    No collective here: only the faulting rank runs it."""
    if newest is None:
        return
    files = sorted((p for p in Path(newest).rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    if not files:
        return
    targets = [files[-1]]
    if local_root is not None:
        targets.append(local_root / Path(newest).name / files[-1].name)
    for target in targets:
        if target.is_file():
            _flip_middle(target)


def _flip_middle(path: Path) -> None:
    with open(path, "r+b") as fh:
        size = path.stat().st_size
        fh.seek(size // 2)
        chunk = fh.read(64)
        fh.seek(size // 2)
        fh.write(bytes(b ^ 0xFF for b in chunk))
        fh.flush()
        os.fsync(fh.fileno())
