"""controlplane/go.mod is what tools/controlplane/gomod.py generates from Kubernetes' own go.mod (read
offline from the Go module cache that `make controlplane` filled)."""

from __future__ import annotations

import pytest

from tests.helpers import require_tool
from tools.controlplane import gomod

UPSTREAM = """module k8s.io/kubernetes

require k8s.io/api v0.0.0

replace (
\tk8s.io/api => ./staging/src/k8s.io/api
\tk8s.io/client-go => ./staging/src/k8s.io/client-go
\tgithub.com/other => github.com/fork v1.0.0
)
"""
WRAPPER = """module blueprint.local/controlplane

require (
\tk8s.io/kubernetes v1.35.4 // indirect
)

replace (
\tk8s.io/api => k8s.io/api v0.35.4
)
"""


def test_the_checked_in_go_mod_is_the_generated_one() -> None:
    text = gomod.GO_MOD.read_text()
    version = gomod.kubernetes_version(text)
    expected = gomod.module_cache() / "cache" / "download" / "k8s.io" / "kubernetes" / "@v" / f"{version}.mod"
    cached = gomod.cached_kubernetes_go_mod(version) or require_tool(
        expected, f"Kubernetes {version}'s go.mod"
    )
    assert gomod.render(text, cached.read_text(), version) == text


def test_a_new_version_rewrites_the_require_and_every_staging_replace() -> None:
    out = gomod.render(WRAPPER, UPSTREAM, "v1.36.1")
    assert "k8s.io/kubernetes v1.36.1 // indirect" in out
    assert (
        "replace (\n\tk8s.io/api => k8s.io/api v0.36.1\n\tk8s.io/client-go => k8s.io/client-go v0.36.1\n)\n"
        in out
    )
    assert "fork" not in out  # only the ./staging replaces are Kubernetes' own modules


@pytest.mark.parametrize(
    ("upstream", "version", "message"),
    [
        ("module k8s.io/kubernetes\n", "v1.35.4", "replaces no module"),
        (UPSTREAM, "v2.0.0", "not a Kubernetes v1.X.Y"),
    ],
)
def test_wrong_inputs_are_named(upstream: str, version: str, message: str) -> None:
    with pytest.raises(gomod.GoModError, match=message):
        gomod.render(WRAPPER, upstream, version)
