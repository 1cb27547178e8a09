"""Storage sizing for the checkpoint cadence: one model that infra (synthesis checks, chart values), the
goodput planner and the cluster smoke run all use, so that the file system a team asks for, the checkpoint
interval its chart runs and the stall the planner assumes come from the same numbers.

Owns: checkpoint bytes of a model (``models``: the trainer's presets, copied, or a team's own parameter
count), the FSx for Lustre PERSISTENT_2 figures with their sources (``fsx``), the sizing itself
(``model``: write time per durable checkpoint, reload time of the whole job, shortest interval the file
system sustains, capacity for the kept checkpoints, the NVMe tier) and the team file's sizing fields with
their defaults (``teamfile``, from already-parsed YAML). docs/infra.md has the table and its sources.
May import: the standard library only (``yaml_readings``, the one reading of the teams file's
scalars, also PyYAML, which each of its readers has). Never ``infra``, ``trainer``, ``tools``, ``bench``
or ``goodput``: infra, goodput and tools import this package, each through its own contract; the trainer
does not need it.
"""

from sizing.fsx import (
    PERSISTENT_2_BURST_MBPS_PER_TIB,
    PERSISTENT_2_THROUGHPUTS,
    fsx_tib,
    smallest_valid_capacity_gib,
)
from sizing.model import SizingInputs, SizingResult, size
from sizing.models import PRESET_PARAMETERS, checkpoint_bytes, parameters_of_preset
from sizing.teamfile import TeamSizingError, team_inputs

__all__ = [
    "PERSISTENT_2_BURST_MBPS_PER_TIB",
    "PERSISTENT_2_THROUGHPUTS",
    "PRESET_PARAMETERS",
    "SizingInputs",
    "SizingResult",
    "TeamSizingError",
    "checkpoint_bytes",
    "fsx_tib",
    "parameters_of_preset",
    "size",
    "smallest_valid_capacity_gib",
    "team_inputs",
]
