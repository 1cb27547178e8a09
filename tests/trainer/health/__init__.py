"""Tests of trainer/health/: the node health daemon."""
