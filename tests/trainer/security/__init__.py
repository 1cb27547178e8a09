"""Tests of trainer/security/: key files and the signatures of manifests and seals."""
