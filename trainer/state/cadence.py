"""When a save is due: the one rule durable checkpoints (trainer/checkpoint/), snapshots
(trainer/snapshot/) and the configuration's checks of in-save faults (trainer/config/) share. Pure
functions, no torch: `--check-config` uses them before any process group exists."""

from __future__ import annotations


def is_due(step: int, interval: int, last_step: int | None = None) -> bool:
    """Whether a save follows step s (0-based): the one definition of "a save is due at step N".

    Due when s + 1 is a multiple of `interval` and, given `last_step`, after the run's last step whatever
    the interval: a run never ends with steps that no checkpoint holds. Snapshots use it without a last
    step (trainer/snapshot/config.py); interval 0 is never due. The chart's render-time rule for
    in-save faults (k8s/templates/_validate.tpl) computes `next_due`, checked against it by
    tests/trainer/config/test_chart_agreement.py.
    """
    return (interval > 0 and (step + 1) % interval == 0) or step == last_step


def next_due(step: int, interval: int, last_step: int) -> int | None:
    """The first step >= `step` after which a save is due (`is_due`), or None when the run ends first.

    An in-save fault (ckpt-crash, ckpt-write-error) given step=N fires in that save.
    """
    if not 0 <= step <= last_step:
        return None
    aligned = step + (-(step + 1)) % interval if interval > 0 else last_step
    return min(aligned, last_step)
