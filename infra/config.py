"""Typed teams configuration: the whole teams file is validated here before any construct is built.

`load_teams(path)` returns validated `TeamConfig`s or raises `TeamsConfigError`, whose message is one line
naming the team index and field, e.g. `teams[1].fsx.storage_gib: PERSISTENT_2 needs 1200 or a multiple of
2400`. Every field, its default and its constraints are documented in docs/infra.md.
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from infra.instance_types import DEFAULT_GPU_INSTANCE_TYPE, GPU_INSTANCE_TYPES

# A DNS-1123 label that also starts with a letter: the team name is the namespace (DNS-1123) and the
# CloudFormation stack name (must start with a letter).
_NAME_RE = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")
_ACCOUNT_RE = re.compile(r"^\d{12}$")
_REGION_RE = re.compile(r"^[a-z]{2}(-gov|-iso[a-z]?)?-[a-z]+-\d$")
_IAM_PRINCIPAL_ARN_RE = re.compile(r"^arn:aws(-cn|-us-gov)?:iam::\d{12}:(role|user)/[\w+=,.@/-]{1,512}$")
# On-demand capacity reservations and capacity blocks share the `cr-` id space (8 or 17 hex digits).
_CAPACITY_ID_RE = re.compile(r"^cr-([0-9a-f]{8}|[0-9a-f]{17})$")
_EC2_TYPE_RE = re.compile(r"^[a-z][a-z0-9-]*\.[a-z0-9]+$")
_S3_PATH_RE = re.compile(r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/[^\s]*)?$")

PERSISTENT_2_THROUGHPUTS = (125, 250, 500, 1000)
KUBERNETES_VERSIONS = ("1.34", "1.35", "1.36")


class TeamsConfigError(Exception):
    """An invalid teams file; `str()` is one line naming the file or `teams[i].field`."""


class _FieldError(ValueError):
    """A cross-field check's failure, carrying the path (relative to the model that raised it)."""

    def __init__(self, path: tuple[str | int, ...], message: str) -> None:
        super().__init__(message)
        self.path = path
        self.message = message


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CapacityConfig(_Model):
    """Where the GPU nodes' capacity comes from."""

    type: Literal["on-demand", "reservation", "capacity-block"] = "on-demand"
    id: str | None = None
    """The `cr-...` id of the on-demand capacity reservation or capacity block; none for on-demand."""

    @model_validator(mode="after")
    def _id_matches_type(self) -> CapacityConfig:
        if self.type == "on-demand":
            if self.id is not None:
                raise _FieldError(
                    ("id",), "on-demand capacity takes no id (use type reservation or capacity-block)"
                )
        elif self.id is None:
            raise _FieldError(("id",), f"capacity type {self.type} needs the cr-... id")
        elif not _CAPACITY_ID_RE.match(self.id):
            raise _FieldError(
                ("id",),
                f"{self.id!r} is not a capacity reservation or capacity block id "
                "(cr- followed by 8 or 17 hex digits)",
            )
        return self


class GpuNodeGroupConfig(_Model):
    """The GPU managed node group (one AZ, one cluster placement group)."""

    instance_type: str = DEFAULT_GPU_INSTANCE_TYPE
    min_nodes: Annotated[int, Field(ge=0)] = 0
    desired_nodes: Annotated[int, Field(ge=1)] = 2
    max_nodes: Annotated[int, Field(ge=1, le=450)] = 2
    capacity: CapacityConfig = CapacityConfig()
    root_volume_gib: Annotated[int, Field(ge=100, le=16384)] = 500
    # Hot spares (NVRx >= 0.7): nodes on top of desired_nodes that run standby trainer pods and take a
    # lost node's place at once. The node group runs desired_nodes + spare_nodes (see node_count).
    spare_nodes: Annotated[int, Field(ge=0)] = 0

    @field_validator("instance_type")
    @classmethod
    def _known_type(cls, value: str) -> str:
        if value not in GPU_INSTANCE_TYPES:
            raise ValueError(
                f"unknown GPU instance type {value!r} (allowed: {', '.join(GPU_INSTANCE_TYPES)})"
            )
        return value

    @model_validator(mode="after")
    def _sizes_ordered(self) -> GpuNodeGroupConfig:
        _check_sizes(self.min_nodes, self.desired_nodes, self.max_nodes)
        if self.node_count > self.max_nodes:
            raise _FieldError(
                ("spare_nodes",),
                f"desired_nodes {self.desired_nodes} + spare_nodes {self.spare_nodes} is above "
                f"max_nodes {self.max_nodes}",
            )
        return self

    @property
    def node_count(self) -> int:
        """Nodes the group runs: the training nodes plus the hot spares."""
        return self.desired_nodes + self.spare_nodes

    @property
    def gpus_per_node(self) -> int:
        return GPU_INSTANCE_TYPES[self.instance_type].gpus


class SystemNodeGroupConfig(_Model):
    """The CPU managed node group for cluster add-ons (spread over all AZs)."""

    instance_type: str = "m6i.xlarge"
    min_nodes: Annotated[int, Field(ge=1)] = 2
    desired_nodes: Annotated[int, Field(ge=1)] = 2
    max_nodes: Annotated[int, Field(ge=1, le=450)] = 4

    @field_validator("instance_type")
    @classmethod
    def _ec2_type(cls, value: str) -> str:
        if not _EC2_TYPE_RE.match(value):
            raise ValueError(f"{value!r} is not an EC2 instance type (family.size, e.g. m6i.xlarge)")
        if value in GPU_INSTANCE_TYPES:
            raise ValueError(f"{value} is a GPU type; system nodes run add-ons only")
        return value

    @model_validator(mode="after")
    def _sizes_ordered(self) -> SystemNodeGroupConfig:
        _check_sizes(self.min_nodes, self.desired_nodes, self.max_nodes)
        return self


def _check_sizes(min_nodes: int, desired: int, max_nodes: int) -> None:
    if min_nodes > desired:
        raise _FieldError(("desired_nodes",), f"desired_nodes {desired} is below min_nodes {min_nodes}")
    if desired > max_nodes:
        raise _FieldError(("desired_nodes",), f"desired_nodes {desired} is above max_nodes {max_nodes}")


class FsxConfig(_Model):
    """FSx for Lustre PERSISTENT_2 (Lustre 2.15, LZ4, KMS) for checkpoints and data."""

    storage_gib: Annotated[int, Field(ge=1200, le=2_400_000)] = 1200
    throughput_per_tib: int = 250
    """MB/s per TiB of storage; PERSISTENT_2 SSD accepts 125, 250, 500 or 1000."""
    s3_path: str | None = None
    """Optional `s3://bucket/prefix` linked by a data repository association (import + export)."""
    s3_file_system_path: str = "/"
    """Where the S3 prefix appears in the file system; `/` links the whole file system."""

    @field_validator("storage_gib")
    @classmethod
    def _capacity_step(cls, value: int) -> int:
        # AWS rejects any other size for PERSISTENT_2 SSD file systems.
        if value != 1200 and value % 2400 != 0:
            raise ValueError(f"PERSISTENT_2 needs 1200 or a multiple of 2400 (got {value})")
        return value

    @field_validator("throughput_per_tib")
    @classmethod
    def _throughput(cls, value: int) -> int:
        if value not in PERSISTENT_2_THROUGHPUTS:
            allowed = ", ".join(map(str, PERSISTENT_2_THROUGHPUTS))
            raise ValueError(f"PERSISTENT_2 throughput per TiB must be one of {allowed} (got {value})")
        return value

    @field_validator("s3_path")
    @classmethod
    def _s3_path(cls, value: str | None) -> str | None:
        if value is not None and not _S3_PATH_RE.match(value):
            raise ValueError(f"{value!r} is not an S3 path (s3://bucket[/prefix])")
        return value

    @field_validator("s3_file_system_path")
    @classmethod
    def _fs_path(cls, value: str) -> str:
        if not value.startswith("/") or "//" in value or any(c.isspace() for c in value):
            raise ValueError(f"{value!r} must be an absolute path inside the file system, e.g. /export")
        return value


class NetworkConfig(_Model):
    """The team VPC: explicit AZs (synth never looks them up), the GPU subnet in one of them."""

    vpc_cidr: str = "10.0.0.0/16"
    availability_zones: Annotated[list[str], Field(min_length=2, max_length=6)]
    gpu_availability_zone: str
    """The AZ of the GPU subnet, the GPU nodes and FSx: p5 capacity lives in one AZ."""
    nat_gateways: Annotated[int, Field(ge=1, le=6)] = 1

    @field_validator("vpc_cidr")
    @classmethod
    def _cidr(cls, value: str) -> str:
        try:
            net = ipaddress.ip_network(value, strict=True)
        except ValueError as exc:
            raise ValueError(f"{value!r} is not a CIDR block ({exc})") from None
        if net.version != 4 or net.prefixlen != 16 or not net.is_private:
            raise ValueError(f"{value} must be a private IPv4 /16 (the subnet layout needs the space)")
        return value

    @field_validator("availability_zones")
    @classmethod
    def _unique(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError("availability zones must be distinct")
        return value

    @model_validator(mode="after")
    def _gpu_az_in_vpc(self) -> NetworkConfig:
        if self.gpu_availability_zone not in self.availability_zones:
            raise _FieldError(
                ("gpu_availability_zone",), f"{self.gpu_availability_zone} is not one of availability_zones"
            )
        if self.nat_gateways > len(self.availability_zones):
            raise _FieldError(("nat_gateways",), "more NAT gateways than availability zones")
        return self


class TeamConfig(_Model):
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
        if not _NAME_RE.match(value):
            raise ValueError(
                f"{value!r} is not a DNS-1123 label starting with a letter (lowercase letters, "
                "digits and '-', at most 63 characters)"
            )
        return value

    @field_validator("account", mode="before")
    @classmethod
    def _account(cls, value: Any) -> Any:
        if isinstance(value, int):
            raise ValueError("quote the account id (YAML reads it as a number and drops leading zeros)")
        if isinstance(value, str) and not _ACCOUNT_RE.match(value):
            raise ValueError(f"{value!r} is not a 12-digit AWS account id")
        return value

    @field_validator("region")
    @classmethod
    def _region(cls, value: str) -> str:
        if not _REGION_RE.match(value):
            raise ValueError(f"{value!r} is not an AWS region name (e.g. us-east-2)")
        return value

    @field_validator("kubernetes_version", mode="before")
    @classmethod
    def _k8s_version(cls, value: Any) -> Any:
        if isinstance(value, float):
            raise ValueError(f"quote the version (YAML reads {value} as a number; 1.30 would become 1.3)")
        if value not in KUBERNETES_VERSIONS:
            raise ValueError(
                f"{value!r} is not supported (allowed: {', '.join(KUBERNETES_VERSIONS)}; the "
                "kubectl layer is 1.35)"
            )
        return value

    @field_validator("endpoint_public_cidrs")
    @classmethod
    def _cidrs(cls, value: list[str]) -> list[str]:
        for cidr in value:
            try:
                ipaddress.ip_network(cidr, strict=True)
            except ValueError:
                raise ValueError(f"{cidr!r} is not a CIDR block") from None
        return value

    @field_validator("admin_principal_arns")
    @classmethod
    def _arns(cls, value: list[str]) -> list[str]:
        for i, arn in enumerate(value):
            if not _IAM_PRINCIPAL_ARN_RE.match(arn):
                raise _FieldError(
                    (i,), f"{arn!r} is not an IAM role or user ARN (arn:aws:iam::<12 digits>:role/<name>)"
                )
        if len(set(value)) != len(value):
            raise ValueError("duplicate principal ARNs")
        return value

    @model_validator(mode="after")
    def _cross_field(self) -> TeamConfig:
        for i, az in enumerate(self.network.availability_zones):
            if not (az.startswith(self.region) and len(az) == len(self.region) + 1 and az[-1].isalpha()):
                raise _FieldError(
                    ("network", "availability_zones", i),
                    f"{az!r} is not an availability zone of {self.region}",
                )
        if self.endpoint_access == "public_and_private" and not self.endpoint_public_cidrs:
            raise _FieldError(
                ("endpoint_public_cidrs",),
                "a public endpoint must be restricted to CIDRs (0.0.0.0/0 is refused)",
            )
        if self.endpoint_access == "private" and self.endpoint_public_cidrs:
            raise _FieldError(
                ("endpoint_public_cidrs",), "only valid with endpoint_access: public_and_private"
            )
        if "0.0.0.0/0" in self.endpoint_public_cidrs:
            raise _FieldError(
                ("endpoint_public_cidrs",), "0.0.0.0/0 would open the API server to the internet"
            )
        gpus = self.gpu_node_group.gpus_per_node
        ceiling = self.gpu_node_group.max_nodes * gpus
        if self.gpu_quota is not None:
            if self.gpu_quota > ceiling:
                raise _FieldError(
                    ("gpu_quota",),
                    f"{self.gpu_quota} GPUs is above what the GPU node group can "
                    f"hold ({self.gpu_node_group.max_nodes} x {gpus} = {ceiling})",
                )
            needed = self.gpu_node_group.node_count * gpus
            if self.deploy_trainer and self.gpu_quota < needed:
                raise _FieldError(
                    ("gpu_quota",),
                    f"{self.gpu_quota} GPUs is below what the trainer release "
                    f"requests ({self.gpu_node_group.node_count} x {gpus} = "
                    f"{needed})",
                )
        return self

    @property
    def effective_gpu_quota(self) -> int:
        """The namespace's nvidia.com/gpu quota: the configured one, else the node group's ceiling."""
        if self.gpu_quota is not None:
            return self.gpu_quota
        return self.gpu_node_group.max_nodes * self.gpu_node_group.gpus_per_node

    @property
    def stack_name(self) -> str:
        return self.name


class TeamsFile(_Model):
    """The whole teams file: `teams:` is a non-empty list; the first team is the default one."""

    teams: Annotated[list[TeamConfig], Field(min_length=1)]

    @model_validator(mode="after")
    def _unique_names(self) -> TeamsFile:
        seen: dict[str, int] = {}
        for i, team in enumerate(self.teams):
            if team.name in seen:
                raise _FieldError(
                    ("teams", i, "name"), f"duplicate team name {team.name!r} (also teams[{seen[team.name]}])"
                )
            seen[team.name] = i
        return self


def _format_loc(loc: tuple[str | int, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "teams file"


def _one_line(exc: ValidationError) -> str:
    """The first error of `exc` as `teams[i].field: message`, counting the others."""
    errors = exc.errors()
    err = errors[0]
    loc = tuple(err["loc"])
    cause = (err.get("ctx") or {}).get("error")
    if isinstance(cause, _FieldError):
        loc, message = loc + cause.path, cause.message
    elif err["type"] == "extra_forbidden":
        message = "unknown key"
    elif err["type"] == "missing":
        message = "required field is missing"
    else:
        message = err["msg"].removeprefix("Value error, ")
    more = f" (and {len(errors) - 1} more)" if len(errors) > 1 else ""
    return f"{_format_loc(loc)}: {message}{more}".replace("\n", " ")


def parse_teams(data: Any, source: str = "teams file") -> list[TeamConfig]:
    """Validate already-parsed YAML data; raise `TeamsConfigError` (one line) on any bad value."""
    if not isinstance(data, dict) or "teams" not in data:
        raise TeamsConfigError(f"{source}: expected a mapping with a 'teams' list at the top level")
    try:
        return list(TeamsFile.model_validate(data).teams)
    except ValidationError as exc:
        raise TeamsConfigError(_one_line(exc)) from None


def load_teams(path: str | Path) -> list[TeamConfig]:
    """Read and validate the teams file at `path`; raise `TeamsConfigError` (one line) on any problem."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TeamsConfigError(f"{path}: teams file not found") from None
    except OSError as exc:
        raise TeamsConfigError(f"{path}: cannot read the teams file ({exc.strerror})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or "unparsable"
        raise TeamsConfigError(f"{path}: invalid YAML{where}: {problem}") from None
    return parse_teams(data, str(path))


def select_team(teams: list[TeamConfig], name: str | None) -> list[TeamConfig]:
    """All teams, or only the one called `name` (the `-c team=NAME` context)."""
    if not name:
        return teams
    chosen = [t for t in teams if t.name == name]
    if not chosen:
        raise TeamsConfigError(f"team={name}: no such team (teams: {', '.join(t.name for t in teams)})")
    return chosen
