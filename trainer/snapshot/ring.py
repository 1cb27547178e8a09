"""Which rank keeps which rank's peer replica: a ring over nodes (no torch: pure arithmetic).

The rank with local rank L on node n sends its snapshots to the rank with local rank L on node
(n + 1) % nnodes, so every node keeps exactly one other node's copies and losing one node loses no
state. Ranks are numbered node by node (rank = node * local_world_size + local_rank), as torchelastic
numbers them. With one node there is nobody to replicate to: `holder` is None.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Ring:
    world_size: int
    local_world_size: int

    def __post_init__(self) -> None:
        if self.local_world_size < 1 or self.world_size < 1:
            raise ValueError(
                f"ring: sizes must be >= 1 (world {self.world_size}, local {self.local_world_size})"
            )
        if self.world_size % self.local_world_size:
            raise ValueError(
                f"ring: world size {self.world_size} is not a multiple of the ranks per node "
                f"{self.local_world_size} (replication needs the same number of ranks on every node)"
            )

    @property
    def nnodes(self) -> int:
        return self.world_size // self.local_world_size

    @property
    def enabled(self) -> bool:
        """Replication needs a second node."""
        return self.nnodes > 1

    def node_of(self, rank: int) -> int:
        self._check(rank)
        return rank // self.local_world_size

    def node_ranks(self, rank: int) -> range:
        """The ranks on `rank`'s node (`rank` included)."""
        first = self.node_of(rank) * self.local_world_size
        return range(first, first + self.local_world_size)

    def holder(self, rank: int) -> int | None:
        """The rank that keeps `rank`'s replica: same local rank, next node (None with one node)."""
        if not self.enabled:
            return None
        node, local = divmod(rank, self.local_world_size)
        self._check(rank)
        return ((node + 1) % self.nnodes) * self.local_world_size + local

    def owner(self, rank: int) -> int | None:
        """The rank whose replica `rank` keeps: same local rank, previous node (None with one node)."""
        if not self.enabled:
            return None
        node, local = divmod(rank, self.local_world_size)
        self._check(rank)
        return ((node - 1) % self.nnodes) * self.local_world_size + local

    def _check(self, rank: int) -> None:
        if not 0 <= rank < self.world_size:
            raise ValueError(f"ring: rank {rank} outside 0..{self.world_size - 1}")
