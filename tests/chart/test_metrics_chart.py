"""The chart exposes the trainer's metrics endpoint to collectors: scrape annotations, the optional
PodMonitor and the linger flag (the NetworkPolicy's networkPolicy.metricsNamespace admits the collector)."""

from __future__ import annotations

from typing import Any

from tests.chart.helm import by_kind, rejection, render, workload_pod_spec


def _pod_template(manifests: list[dict[str, Any]]) -> dict[str, Any]:
    (job,) = by_kind(manifests, "Job")
    return job["spec"]["template"]


def test_defaults_annotate_every_trainer_pod_for_scraping() -> None:
    manifests = render()
    template = _pod_template(manifests)
    annotations = template["metadata"]["annotations"]
    assert annotations == {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": "9400",
        "prometheus.io/path": "/metrics",
    }
    (container,) = template["spec"]["containers"]
    assert {"name": "metrics", "containerPort": 9400} in container["ports"]
    assert "--metrics-port=9400" in container["args"] and "--metrics-linger=60" in container["args"]
    assert not by_kind(manifests, "PodMonitor")


def test_user_annotations_are_kept_and_the_exporter_off_means_no_scrape() -> None:
    template = _pod_template(render({"podAnnotations": {"team": "a b"}, "metricsPort": 0}))
    assert template["metadata"]["annotations"] == {"team": "a b"}
    template = _pod_template(render({"metricsScrapeAnnotations": False}))
    assert "annotations" not in template["metadata"]


def test_pod_monitor_selects_the_trainer_pods_metrics_port() -> None:
    manifests = render({"podMonitor": {"enabled": True, "interval": "15s", "labels": {"release": "kps"}}})
    (monitor,) = by_kind(manifests, "PodMonitor")
    assert monitor["metadata"]["labels"]["release"] == "kps"
    assert monitor["spec"]["podMetricsEndpoints"] == [
        {"port": "metrics", "path": "/metrics", "interval": "15s"}
    ]
    pod_labels = _pod_template(manifests)["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()
    assert workload_pod_spec(manifests)["containers"][0]["ports"][1]["name"] == "metrics"


def test_bad_metrics_values_are_rejected_naming_the_field() -> None:
    assert "podMonitor.enabled needs metricsPort > 0" in rejection(
        {"podMonitor": {"enabled": True}, "metricsPort": 0}
    )
    assert "metricsLinger" in rejection({"metricsLinger": -1})
    assert "interval" in rejection({"podMonitor": {"interval": "soon"}})
