"""The `observability:` block of a team in the teams file: which collector, where alarms go, thresholds.

TeamConfig (infra/teams/team.py) holds it as one field; errors surface as
`teams[i].observability.<field>: message` through the teams file's error formatting.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, model_validator

from infra.teams.base import StrictModel
from infra.teams.chart_bounds import chart_default
from infra.teams.errors import FieldError

ADDON_VERSION_PATTERN = r"^v[0-9]+\.[0-9]+\.[0-9]+-eksbuild\.[0-9]+$"


class AlarmThresholds(StrictModel):
    """When the team's alarms fire (each routed to the alarm topic)."""

    no_progress_minutes: Annotated[int, Field(ge=1, le=1440)] = 15
    """"No progress": no training step ended for this long while the run is not finished."""
    min_goodput_last_hour: Annotated[float, Field(gt=0, le=1)] = 0.8
    """"Goodput below X": productive share of the last hour (trainer_goodput_last_hour_ratio) under this."""
    max_checkpoint_age_minutes: Annotated[int, Field(ge=1, le=10080)] = 90
    """"Checkpoint older than Y": no durable checkpoint for this long (keep it above the save interval)."""


class ObservabilityConfig(StrictModel):
    """Collection of cluster, GPU, EFA and trainer metrics, the team dashboard and its alarms."""

    collector: Literal["cloudwatch", "prometheus"] = "cloudwatch"
    """cloudwatch: the amazon-cloudwatch-observability EKS add-on (Container Insights with GPU and EFA
    metrics) plus a CloudWatch agent that scrapes the trainer; prometheus: kube-prometheus-stack and the
    DCGM exporter, pinned Helm charts in the `monitoring` namespace (docs/infra.md explains the choice)."""
    alarm_topic_name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_-]{1,256}$")] | None = None
    """Name of the SNS topic the stack creates for the alarms; default `<team>-training-alarms`."""
    alarm_emails: list[Annotated[str, Field(pattern=r"^[^@\s]+@[^@\s]+\.[^@\s]+$")]] = []
    """E-mail addresses subscribed to the alarm topic (each confirms the subscription once)."""
    scrape_interval_s: Annotated[int, Field(ge=10, le=300)] = 30
    """How often the collector scrapes the trainer's endpoint."""
    # [0-9], not \d: pydantic's Rust regex reads \d as any Unicode digit (Arabic-Indic, fullwidth).
    cloudwatch_addon_version: Annotated[str, Field(pattern=ADDON_VERSION_PATTERN)] | None = None
    """amazon-cloudwatch-observability add-on version; none: EKS's default for the cluster's version."""
    alarms: AlarmThresholds = AlarmThresholds()

    @model_validator(mode="after")
    def _no_dead_settings(self) -> ObservabilityConfig:
        if self.collector == "prometheus" and self.cloudwatch_addon_version is not None:
            raise FieldError(
                ("cloudwatch_addon_version",),
                "has no effect with collector: prometheus (the CloudWatch add-on is not installed); "
                "remove it or use collector: cloudwatch",
            )
        # The trainer's endpoint outlives a finished run by the chart's metricsLinger, for one more scrape.
        linger = chart_default("metricsLinger")
        if self.scrape_interval_s >= linger:
            raise FieldError(
                ("scrape_interval_s",),
                f"{self.scrape_interval_s} s is not shorter than the chart's metricsLinger ({linger:g} s, "
                "k8s/values.yaml): a finished run's endpoint would be gone before the next scrape and its "
                "last figures lost; scrape more often",
            )
        return self


def alarm_topic_name(team_name: str, config: ObservabilityConfig) -> str:
    """The SNS topic's name: the team's `alarm_topic_name`, else `<team>-training-alarms`."""
    return config.alarm_topic_name or f"{team_name}-training-alarms"
