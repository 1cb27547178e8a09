"""Typed teams configuration: the whole teams file is validated here before any construct is built.

`load_teams(path)` returns validated `TeamConfig`s or raises `TeamsConfigError`, whose message is one line
naming the team index and field, e.g. `teams[1].fsx.storage_gib: PERSISTENT_2 needs 1200 or a multiple of
2400`. Every field, its default and its constraints are documented in docs/infra.md. The models and
checks live in the `infra.teams` package, one module per job; this module is the stable import point.
"""

from __future__ import annotations

from infra.teams.checkpoints import TeamCheckpoints
from infra.teams.errors import TeamsConfigError
from infra.teams.loader import load_teams, parse_teams, select_team
from infra.teams.network import NetworkConfig
from infra.teams.nodes import CapacityConfig, GpuNodeGroupConfig, SystemNodeGroupConfig
from infra.teams.storage import PERSISTENT_2_THROUGHPUTS, FsxConfig
from infra.teams.team import KUBERNETES_VERSIONS, TeamConfig, TeamsFile

__all__ = [
    "KUBERNETES_VERSIONS",
    "PERSISTENT_2_THROUGHPUTS",
    "CapacityConfig",
    "FsxConfig",
    "GpuNodeGroupConfig",
    "NetworkConfig",
    "SystemNodeGroupConfig",
    "TeamCheckpoints",
    "TeamConfig",
    "TeamsConfigError",
    "TeamsFile",
    "load_teams",
    "parse_teams",
    "select_team",
]
