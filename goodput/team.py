"""A team's own figures for the planner (``--teams FILE --team NAME``): its nodes, step time, checkpoint
interval, the stall of its saves and the reload time of its whole job, all from the ``sizing`` package's
reading of the teams file (the same model infra checks at synthesis). The YAML is read as infra reads it
(``sizing.yaml_readings``: a scalar YAML 1.1 and 1.2 read differently is refused, naming its line), with
PyYAML imported only when ``--teams`` is given; the planner never imports infra.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from goodput.inputs import NODE_LOSS_MTTR_S
from goodput.model import PlanError
from sizing import SizingResult, size
from sizing.teamfile import TeamSizingError, find_team, team_inputs

# The default tiers' MTTRs (goodput/inputs.py) hold an assumed 60 s durable-checkpoint read: a peer tier
# whose replica is lost (the node-loss MTTR of goodput/node_loss.py + 60 s) and a job restart (840 s of
# scheduling, image pull and start-up + 60 s). With a team's sizing the read is the team's own reload time.
PEER_MTTR_S = float(NODE_LOSS_MTTR_S)
JOB_RESTART_WITHOUT_LOAD_S = 840.0


def read_team(path: Path, name: str | None) -> tuple[str, SizingResult]:
    """The team's name and sizing from a teams file; PlanError (one line) when it cannot be read."""
    import yaml

    from sizing.yaml_readings import load_unambiguous

    try:
        data = load_unambiguous(Path(path).read_text(encoding="utf-8"))
        team = find_team(data, name)
        return str(team.get("name")), size(team_inputs(team))
    except OSError as err:
        raise PlanError(f"--teams {path}: {err.strerror or err}") from None
    except yaml.YAMLError as err:
        raise PlanError(f"--teams {path}: invalid YAML ({str(err).splitlines()[0]})") from None
    except (TeamSizingError, ValueError, TypeError) as err:
        raise PlanError(f"--teams {path}: {err}") from None


def team_tiers(default_tiers: tuple[str, ...], reload_s: float) -> tuple[str, ...]:
    """The default tier specs with the durable-checkpoint read replaced by the team's reload time."""
    out = []
    for spec in default_tiers:
        name = spec.split(":", 1)[0]
        if name == "node-loss":
            spec = re.sub(r"fallback-mttr=[0-9.]+", f"fallback-mttr={PEER_MTTR_S + reload_s!r}", spec)
        elif name == "job-restart":
            spec = spec.replace("mttr=900", f"mttr={JOB_RESTART_WITHOUT_LOAD_S + reload_s!r}")
        out.append(spec)
    return tuple(out)


def team_overrides(sizing: SizingResult) -> dict[str, Any]:
    """The planner options a team's sizing sets (those the user did not give on the command line)."""
    i = sizing.inputs
    return {
        "nodes": i.nodes,
        "gpus_per_node": i.gpus_per_node,
        "stall": sizing.stall_s,
        "interval": i.interval_s,
        "step_time": i.step_s,
        "state_gib_per_gpu": i.checkpoint_bytes / (i.nodes * i.gpus_per_node) / 2**30,
    }
