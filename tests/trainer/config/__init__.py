"""Tests of trainer/config/: the settings mechanism, the generated CLI, the chart-to-trainer table, and
the bad inputs that must stop in one line before any process group."""
