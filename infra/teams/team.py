"""One team's environment and the whole teams file, with the checks that span several fields."""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, Literal

from pydantic import Field, field_validator, model_validator

from infra.inputs import ascii_digits_problem
from infra.instance_types import GPU_INSTANCE_TYPES
from infra.teams.aws_rules import (
    arn_problem,
    public_cidrs_problem,
    region_problem,
    team_name_problem,
)
from infra.teams.base import StrictModel
from infra.teams.chart_bounds import chart_bound_problem
from infra.teams.checkpoints import TeamCheckpoints, checkpoint_values, sizing_inputs
from infra.teams.errors import FieldError
from infra.teams.network import NetworkConfig
from infra.teams.nodes import GpuNodeGroupConfig, SystemNodeGroupConfig
from infra.teams.observability import ObservabilityConfig, alarm_topic_name
from infra.teams.storage import FsxConfig
from sizing import teamfile
from sizing.model import SizingResult, size

KUBERNETES_VERSIONS = ("1.34", "1.35", "1.36")


class TeamConfig(StrictModel):
    """One team's environment: one CloudFormation stack, one EKS cluster, one namespace."""

    name: str
    account: str
    region: str
    kubernetes_version: str = "1.35"
    network: NetworkConfig
    endpoint_access: Literal["private", "public_and_private"] = "private"
    endpoint_public_cidrs: list[str] = []
    """CIDRs allowed to reach the public endpoint; required (and only allowed) with public_and_private."""
    admin_principal_arns: Annotated[list[str], Field(min_length=1)]
    gpu_node_group: GpuNodeGroupConfig = GpuNodeGroupConfig()
    system_node_group: SystemNodeGroupConfig = SystemNodeGroupConfig()
    fsx: FsxConfig = FsxConfig()
    checkpoints: TeamCheckpoints = TeamCheckpoints()
    """The checkpoint cadence the file system is sized for (checked at synthesis; chart ckpt* values)."""
    observability: ObservabilityConfig = ObservabilityConfig()
    gpu_quota: Annotated[int, Field(ge=1)] | None = None
    """nvidia.com/gpu the team namespace may request; default: everything the GPU node group can hold."""
    deploy_trainer: bool = True
    """Install the trainer chart (k8s/) as a Helm release at deploy time."""
    start_trainer: bool = False
    """Start the trainer Job at deploy time. Off by default: the release is installed suspended, because a
    fresh FSx file system has no training data yet and GPU hours should start when the team says so.
    Set it to true (and `cdk deploy` again) to run; the Job resumes from its newest checkpoint."""

    @field_validator("name")
    @classmethod
    def _dns_label(cls, value: str) -> str:
        if problem := team_name_problem(value):
            raise ValueError(problem)
        return value

    @field_validator("account", mode="before")
    @classmethod
    def _account(cls, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            raise ValueError("quote the account id (YAML reads it as a number and drops leading zeros)")
        if isinstance(value, str) and (problem := ascii_digits_problem(value, 12, "12-digit AWS account id")):
            raise ValueError(problem)
        return value

    @field_validator("region")
    @classmethod
    def _region(cls, value: str) -> str:
        if problem := region_problem(value):
            raise ValueError(problem)
        return value

    @field_validator("kubernetes_version", mode="before")
    @classmethod
    def _k8s_version(cls, value: Any) -> Any:
        if isinstance(value, float):
            raise ValueError(f"quote the version (YAML reads {value} as a number; 1.30 would become 1.3)")
        if value not in KUBERNETES_VERSIONS:
            raise ValueError(
                f"{value!r} is not supported (allowed: {', '.join(KUBERNETES_VERSIONS)}; "
                "the kubectl layer is 1.35)"
            )
        return value

    @field_validator("endpoint_public_cidrs")
    @classmethod
    def _cidrs(cls, value: list[str]) -> list[str]:
        if problem := public_cidrs_problem(value):
            raise ValueError(problem)
        return value

    @field_validator("admin_principal_arns")
    @classmethod
    def _arns(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError("duplicate principal ARNs")
        return value

    @model_validator(mode="after")
    def _cross_field(self) -> TeamConfig:
        self._check_region_consistency()
        if self.endpoint_access == "public_and_private" and not self.endpoint_public_cidrs:
            raise FieldError(
                ("endpoint_public_cidrs",),
                "a public endpoint must be restricted to CIDRs (0.0.0.0/0 is refused)",
            )
        if self.endpoint_access == "private" and self.endpoint_public_cidrs:
            raise FieldError(
                ("endpoint_public_cidrs",), "only valid with endpoint_access: public_and_private"
            )
        if self.start_trainer and not self.deploy_trainer:
            raise FieldError(
                ("start_trainer",), "true needs deploy_trainer: true (the trainer is not deployed)"
            )
        self._check_quota()
        self._check_chart_bounds()
        self._check_storage_sizing()
        self._check_write_timeout_bound()
        self._check_checkpoint_age_alarm()
        return self

    def _check_checkpoint_age_alarm(self) -> None:
        """The newest checkpoint grows as old as the interval plus the write before the next one commits;
        an alarm threshold at or below that fires on every healthy run."""
        sizing = self.storage_sizing
        cadence_s = sizing.inputs.interval_s + sizing.write_s
        limit = self.observability.alarms.max_checkpoint_age_minutes
        if cadence_s < limit * 60:
            return
        written = [
            f
            for f in ("interval_steps", "interval_minutes", "step_seconds")
            if f in self.checkpoints.model_fields_set
        ]
        loc: tuple[str, ...] = (
            ("checkpoints", written[0])
            if written
            else ("observability", "alarms", "max_checkpoint_age_minutes")
        )
        raise FieldError(
            loc,
            f"checkpoints every {sizing.inputs.interval_s / 60:g} min plus a {sizing.write_s / 60:.1f} min "
            f"write reach observability.alarms.max_checkpoint_age_minutes ({limit}) on every healthy run, so "
            "the alarm always fires; checkpoint more often or raise max_checkpoint_age_minutes",
        )

    def _check_chart_bounds(self) -> None:
        """Each chart value this team derives is within the chart's own schema bounds (values.schema.json),
        so the chart never refuses at deploy what passed here; the error names the field the team wrote."""
        ck = self.checkpoints.declared()
        if ck.interval_steps is not None:
            interval: tuple[float, tuple[str, ...], str] = (
                ck.interval_steps,
                ("checkpoints", "interval_steps"),
                "",
            )
        else:
            minutes = ck.interval_minutes or teamfile.DEFAULT_INTERVAL_MINUTES
            set_fields = self.checkpoints.model_fields_set
            written = "step_seconds" if "step_seconds" in set_fields else "interval_minutes"
            steps = minutes * 60 / ck.step_seconds  # what teamfile.interval_steps floors, if finite
            interval = (
                max(1, math.floor(steps)) if math.isfinite(steps) else steps,  # as teamfile.interval_steps
                ("checkpoints", written),
                f" (interval_minutes {minutes:g} / step_seconds {ck.step_seconds:g} as steps)",
            )
        group = self.gpu_node_group
        derived = [
            ("ckptInterval", *interval),
            ("ckptKeep", ck.keep, ("checkpoints", "keep"), ""),
            ("preset", ck.preset, ("checkpoints", "model"), ""),
            ("nodes", group.desired_nodes, ("gpu_node_group", "desired_nodes"), ""),
            ("spareNodes", group.spare_nodes, ("gpu_node_group", "spare_nodes"), ""),
        ]
        for chart_name, value, loc, how in derived:
            if value is None:  # no preset: the team's own parameter count
                continue
            if problem := chart_bound_problem(chart_name, value):
                raise FieldError(loc, problem + how)

    def _check_write_timeout_bound(self) -> None:
        """The ckptWriteTimeout derived from the sized write time is within the chart's bound too."""
        timeout = checkpoint_values(self.checkpoints, self.storage_sizing.write_s)["ckptWriteTimeout"]
        if problem := chart_bound_problem("ckptWriteTimeout", timeout):
            raise FieldError(
                ("checkpoints",),
                f"team {self.name}: twice the sized checkpoint write time gives ckptWriteTimeout "
                f"{timeout} s: {problem}; give fsx more throughput or checkpoint a smaller model",
            )

    def _check_storage_sizing(self) -> None:
        """FSx must write one checkpoint within the interval and hold `keep` of them (sizing package)."""
        problems = self.storage_sizing.problems
        if problems:
            raise FieldError(("checkpoints",), f"team {self.name}: " + "; and ".join(problems))

    @property
    def storage_sizing(self) -> SizingResult:
        """The sizing of this team's checkpoints on its file system and training nodes."""
        instance = GPU_INSTANCE_TYPES[self.gpu_node_group.instance_type]
        return size(
            sizing_inputs(
                self.checkpoints,
                nodes=self.gpu_node_group.desired_nodes,
                gpus_per_node=instance.gpus,
                fsx_gib=self.fsx.storage_gib,
                throughput_per_tib=self.fsx.throughput_per_tib,
                nvme_gib_per_node=float(instance.nvme_devices * instance.nvme_gib_each),
            )
        )

    def _check_region_consistency(self) -> None:
        """AZs and ARNs must belong to the team's region and its partition."""
        az = re.compile(re.escape(self.region) + "[a-z]")
        for i, zone in enumerate(self.network.availability_zones):
            if not az.fullmatch(zone):
                raise FieldError(
                    ("network", "availability_zones", i),
                    f"{zone!r} is not an availability zone of {self.region} "
                    "(the region name and one lowercase letter)",
                )
        for i, arn in enumerate(self.admin_principal_arns):
            if problem := arn_problem(arn, self.region):
                raise FieldError(("admin_principal_arns", i), problem)

    def _check_quota(self) -> None:
        gpus = self.gpu_node_group.gpus_per_node
        ceiling = self.gpu_node_group.max_nodes * gpus
        if self.gpu_quota is None:
            return
        if self.gpu_quota > ceiling:
            raise FieldError(
                ("gpu_quota",),
                f"{self.gpu_quota} GPUs is above what the GPU node group can hold "
                f"({self.gpu_node_group.max_nodes} x {gpus} = {ceiling})",
            )
        needed = self.gpu_node_group.node_count * gpus  # hot spares included
        if self.deploy_trainer and self.gpu_quota < needed:
            raise FieldError(
                ("gpu_quota",),
                f"{self.gpu_quota} GPUs is below what the trainer release requests "
                f"({self.gpu_node_group.node_count} x {gpus} = {needed})",
            )

    @property
    def effective_gpu_quota(self) -> int:
        """The namespace's nvidia.com/gpu quota: the configured one, else the node group's ceiling."""
        if self.gpu_quota is not None:
            return self.gpu_quota
        return self.gpu_node_group.max_nodes * self.gpu_node_group.gpus_per_node

    @property
    def stack_name(self) -> str:
        return self.name

    @property
    def owned_names(self) -> list[tuple[str, str, str, bool]]:
        """(kind, name, the field it comes from, whether the team wrote it) of every name this team's stack
        creates that AWS keeps one of per account and region; the cross-team check refuses two teams
        sharing one. Log groups and the dashboard are named after the stack, so the stack covers them."""
        topic = alarm_topic_name(self.name, self.observability)
        written = self.observability.alarm_topic_name is not None
        return [
            ("CloudFormation stack", self.stack_name, "name", True),
            ("SNS topic", topic, "observability.alarm_topic_name", written),
        ]


class TeamsFile(StrictModel):
    """The whole teams file: `teams:` is a non-empty list; the first team is the default one."""

    teams: Annotated[list[TeamConfig], Field(min_length=1)]

    @model_validator(mode="after")
    def _unique_names(self) -> TeamsFile:
        seen: dict[str, int] = {}
        for i, team in enumerate(self.teams):
            if team.name in seen:
                raise FieldError(
                    ("teams", i, "name"), f"duplicate team name {team.name!r} (also teams[{seen[team.name]}])"
                )
            seen[team.name] = i
        self._check_shared_names()
        self._check_shared_exports()
        return self

    def _check_shared_names(self) -> None:
        """Names AWS keeps one of per account and region, derived or written: two teams may not share one
        (the second stack's deploy would fail, or, for a topic, both teams' alarms would mix)."""
        owners: dict[tuple[str, str, str, str], tuple[int, str, bool]] = {}
        for i, team in enumerate(self.teams):
            for kind, name, field, written in team.owned_names:
                key = (kind, team.account, team.region, name)
                if key in owners:
                    j, other_field, other_written = owners[key]
                    how = "" if other_written else "default "
                    raise FieldError(
                        ("teams", i, *field.split(".")),
                        f"the {kind} {name!r} is also the {how}{kind} of team {self.teams[j].name} "
                        f"(teams[{j}].{other_field}) in account {team.account}, {team.region}; "
                        f"give team {team.name} its own",
                    )
                owners[key] = (i, field, written)

    def _check_shared_exports(self) -> None:
        """Two file systems linked to one S3 prefix (or one inside the other) export the same run names
        (the chart's default run, `checkpoints/<run>/`) to the same keys and overwrite each other."""
        linked: list[tuple[int, str]] = []
        for i, team in enumerate(self.teams):
            if team.fsx.s3_path is None:
                continue
            mine = team.fsx.s3_path.rstrip("/") + "/"
            for j, theirs in linked:
                if mine.startswith(theirs) or theirs.startswith(mine):
                    other = self.teams[j]
                    raise FieldError(
                        ("teams", i, "fsx", "s3_path"),
                        f"{team.fsx.s3_path} overlaps team {other.name}'s export {other.fsx.s3_path} "
                        f"(teams[{j}].fsx.s3_path): both file systems export the same run names there and "
                        "would overwrite each other's checkpoints; give each team its own prefix",
                    )
            linked.append((i, mine))
