"""The goodput planner: expected training efficiency and the best checkpoint interval at cluster scale.

Users run it (``python -m goodput``) to choose a checkpoint interval for their scale, failure rate and
recovery tiers; the demo and the benchmarks feed it measured runs.

Owns: the model and its optimum (``model``), named failure rates (``profiles``), the cluster-scale
defaults with their sources and the rollbacks read from measurement files (``inputs``), tier specs, the
snapshot interval and the replica-loss window (``tiers``), an event-by-event Monte Carlo check of the
model (``montecarlo``), fitting the model to a measured run or to bench.recovery's MTTRs (``fit``), the
scale plot (``plot``) and the CLI (``cli``). docs/goodput.md lists the inputs.
A team's own figures (``--teams``, ``team``) come from the ``sizing`` package's reading of the teams file.
May import: the standard library, numpy, matplotlib, ``sizing`` (and PyYAML for ``--teams``). Never
``infra``, ``trainer``, ``tools`` or ``bench``: it reads the trainer's output files (Contract 3 of
docs/design.md) and the teams file, not their code.
"""

from goodput.fit import (
    MEASURED_SOURCES,
    incidents,
    plan_from_summary,
    predict_from_summary,
    run_overheads,
    with_measured_mttrs,
)
from goodput.model import (
    DEFAULT_SCALES,
    Outcome,
    Plan,
    PlanError,
    Tier,
    checkpoint_restart_baseline,
    evaluate,
    optimal_interval,
    plan_dict,
    plan_from_dict,
    scale_sweep,
    young_daly_interval,
)
from goodput.profiles import PROFILES

__all__ = [
    "DEFAULT_SCALES",
    "MEASURED_SOURCES",
    "PROFILES",
    "Outcome",
    "Plan",
    "PlanError",
    "Tier",
    "checkpoint_restart_baseline",
    "evaluate",
    "incidents",
    "optimal_interval",
    "plan_dict",
    "plan_from_dict",
    "plan_from_summary",
    "predict_from_summary",
    "run_overheads",
    "scale_sweep",
    "with_measured_mttrs",
    "young_daly_interval",
]
