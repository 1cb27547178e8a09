"""Turn the benchmark JSON under bench/results/ into markdown tables, PNG plots and the README section
(``python -m bench.report``). One module per section (recovery, planner, synth), the markdown and plot
helpers, and the assembly that writes RESULTS.md and the README section."""

from bench.report.assemble import END, START, build, main, replace_between_markers, write
from bench.report.fmt import fmt_spread, md_table, rows_section
from bench.report.planner import planner_section
from bench.report.recovery import detector, recovery_plot, recovery_section
from bench.report.synth import synth_plot, synth_section

__all__ = [
    "END",
    "START",
    "build",
    "detector",
    "fmt_spread",
    "main",
    "md_table",
    "planner_section",
    "recovery_plot",
    "recovery_section",
    "replace_between_markers",
    "rows_section",
    "synth_plot",
    "synth_section",
    "write",
]
