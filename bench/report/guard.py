"""The report's numerical guard section: its cost per step (bench/guard.py)."""

from __future__ import annotations

from typing import Any

from bench.report.fmt import fmt_spread, md_table


def guard_section(res: dict[str, Any]) -> str:
    """The numerical guard's cost per step (bench/guard.py)."""
    share, over = res["parts_share"], res["overhead"]
    return "\n".join(
        [
            "## Numerical guard",
            "",
            f"`{res['command']}`: the {res['preset']} model ({res['params']:,} parameters, {res['device']}, "
            f"{res.get('tokens_per_step', '?')} tokens per step), "
            f"{res['steps_per_rep']} steps per mode and repetition, {len(res['reps'])} repetitions.",
            "",
            md_table(
                ["step, guard off", "step, guard on", "on vs off", "the guard's own work, share of a step"],
                [
                    [
                        fmt_spread(res["step_off_s"], "s", 4),
                        fmt_spread(res["step_on_s"], "s", 4),
                        f"{over['median']:+.2%} ({over['min']:+.2%} .. {over['max']:+.2%})",
                        f"{share['median']:.3%} ({share['min']:.3%} .. {share['max']:.3%}), "
                        f"target < {res['target']:.0%}",
                    ]
                ],
            ),
            "",
        ]
    )
