"""Tests of trainer/digest/: the sharded state digest."""
