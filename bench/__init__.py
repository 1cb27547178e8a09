"""Benchmarks (``make bench``): recovery per fault and tier, checkpoint stall, synth scaling, and the
report that turns their results into bench/results/RESULTS.md and the README section.

May import: ``tools`` (the local pod runner, the pod command builder), ``trainer``, ``goodput`` (the
planner's figures and its validation on the measured runs). Nothing imports ``bench``.
"""
