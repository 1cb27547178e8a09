"""Tests of trainer/runtime/: exact resume across both tiers, the training store's start, a read-only
root filesystem."""
