"""The Kubernetes namespaces a team's cluster already has or the blueprint's own add-ons use.

A team's namespace is named after the team (its quota, service account and trainer release live there),
so a team named after one of these would put them into a system or add-on namespace. The add-on modules
import their namespace from here, so a new add-on namespace is refused as a team name without a second
list (tests/infra checks that every pinned chart's namespace is one of these).
"""

from __future__ import annotations

# Kubernetes creates these in every cluster; `kube-` is reserved for its system namespaces.
KUBERNETES_NAMESPACES = ("default", "kube-system", "kube-public", "kube-node-lease")
RESERVED_NAMESPACE_PREFIX = "kube-"

CLOUDWATCH_K8S_NAMESPACE = "amazon-cloudwatch"  # created by the amazon-cloudwatch-observability add-on
PROMETHEUS_K8S_NAMESPACE = "monitoring"  # kube-prometheus-stack and the DCGM exporter

ADDON_NAMESPACES = (CLOUDWATCH_K8S_NAMESPACE, PROMETHEUS_K8S_NAMESPACE)


def namespace_owner(name: str) -> str | None:
    """Who owns the namespace `name` in a team's cluster, or None when a team may take it."""
    if name in KUBERNETES_NAMESPACES or name.startswith(RESERVED_NAMESPACE_PREFIX):
        return "Kubernetes (a system namespace; kube- is reserved)"
    if name == CLOUDWATCH_K8S_NAMESPACE:
        return "the CloudWatch observability add-on (collector: cloudwatch)"
    if name == PROMETHEUS_K8S_NAMESPACE:
        return "the Prometheus collector (collector: prometheus)"
    return None
