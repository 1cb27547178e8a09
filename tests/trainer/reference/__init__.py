"""Tests of trainer/reference/: the model and its presets, the token data and its cursor."""
