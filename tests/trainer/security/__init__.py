"""Tests of trainer/security/: key files."""
