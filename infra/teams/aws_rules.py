"""AWS naming and network rules the teams file is checked against, as pure functions.

Each returns None when the value is acceptable, else the reason AWS (or the stacks) would refuse it, so
a bad value stops synth in one line instead of failing a deploy minutes later.
"""

from __future__ import annotations

import ipaddress
import re

from infra.inputs import ACCOUNT_ID, cidr_problem, non_ascii_problem, path_segments_problem
from infra.inputs import IAM_PRINCIPAL_ARN as ARN_PATTERN
from infra.inputs import partition_of as partition_of
from infra.inputs import region_problem as region_problem
from infra.namespaces import namespace_owner

# Patterns are matched with fullmatch: `$` would accept a trailing newline (a YAML block scalar).
# re.ASCII everywhere: `\d` and `\w` would accept Arabic-Indic digits and Cyrillic letters (infra/inputs.py).
TEAM_NAME = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?", re.ASCII)
ACCOUNT = ACCOUNT_ID
IAM_PRINCIPAL_ARN = ARN_PATTERN
# On-demand capacity reservations and capacity blocks share the `cr-` id space (8 or 17 hex digits).
CAPACITY_ID = re.compile(r"cr-([0-9a-f]{8}|[0-9a-f]{17})", re.ASCII)
EC2_TYPE = re.compile(r"[a-z][a-z0-9-]*\.[a-z0-9]+", re.ASCII)
S3_PATH = re.compile(r"s3://(?P<bucket>[^/]*)(?P<prefix>/\S*)?")
_BUCKET_CHARS = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]", re.ASCII)

# Names infra derives from the team name (node groups, the FSx PV); EKS and Kubernetes cap them at 63.
# The longest suffix decides how long a team name may be: keep it in step with cluster.py,
# gpu_nodegroup.py and storage.py (tests/infra synthesizes a team of the longest allowed name).
DERIVED_NAME_SUFFIXES = ("-system", "-gpu", "-fsx")
MAX_DERIVED_NAME = 63
MAX_TEAM_NAME = MAX_DERIVED_NAME - max(map(len, DERIVED_NAME_SUFFIXES))

# EKS: public endpoint access CIDR ranges per cluster (a service quota AWS does not raise).
MAX_PUBLIC_ACCESS_CIDRS = 40
# FSx data repository associations: FileSystemPath length limit (API reference). Its DataRepositoryPath
# limit (4357) is never reached: the S3 key limit below bounds the prefix far shorter.
MAX_FSX_FILE_SYSTEM_PATH = 4096
# S3 keys are at most 1024 bytes (UTF-8). An exported file's key is the prefix plus its path below the
# linked directory (checkpoints/<run>/<step>/<file>, a few dozen to ~150 bytes): leave it 256.
MAX_S3_KEY_BYTES = 1024
EXPORT_PATH_ROOM = 256

_RFC1918 = tuple(ipaddress.IPv4Network(n) for n in ("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16"))


def team_name_problem(name: str) -> str | None:
    if not TEAM_NAME.fullmatch(name):
        return (
            f"{name!r} is not a DNS-1123 label starting with a letter (lowercase letters, digits and '-', "
            "ending with a letter or digit)"
        )
    if len(name) > MAX_TEAM_NAME:
        longest = name + max(DERIVED_NAME_SUFFIXES, key=len)
        return (
            f"{len(name)} characters is too long: derived names such as the node group {longest!r} "
            f"({len(longest)}) must stay within {MAX_DERIVED_NAME} (at most {MAX_TEAM_NAME} characters)"
        )
    if owner := namespace_owner(name):
        return (
            f"{name!r} is a namespace of {owner}; the team's namespace (quota, service account, trainer) "
            "is named after the team, so choose another name"
        )
    return None


def arn_problem(arn: str, region: str) -> str | None:
    match = IAM_PRINCIPAL_ARN.fullmatch(arn)
    if not match:
        ascii_hint = f" ({problem})" if (problem := non_ascii_problem(arn)) else ""
        return (
            f"{arn!r} is not an IAM role or user ARN (arn:<partition>:iam::<12 digits>:role/<name>)"
            + ascii_hint
        )
    expected = partition_of(region)
    if match["partition"] != expected:
        return f"{arn!r} is in partition {match['partition']}, but region {region} is in {expected}"
    return None


def bucket_problem(bucket: str) -> str | None:
    """S3 general purpose bucket naming rules."""
    if not _BUCKET_CHARS.fullmatch(bucket):
        return (
            f"bucket {bucket!r} must be 3 to 63 lowercase letters, digits, '.' and '-', "
            "starting and ending with a letter or digit"
        )
    if ".." in bucket:
        return f"bucket {bucket!r} must not contain two adjacent periods"
    try:
        ipaddress.IPv4Address(bucket)
        return f"bucket {bucket!r} must not be formatted as an IP address"
    except ValueError:
        pass
    for prefix in ("xn--", "sthree-", "amzn-s3-demo-"):
        if bucket.startswith(prefix):
            return f"bucket {bucket!r} must not start with the reserved prefix {prefix!r}"
    for suffix in ("-s3alias", "--ol-s3", ".mrap", "--x-s3", "--table-s3"):
        if bucket.endswith(suffix):
            return f"bucket {bucket!r} must not end with the reserved suffix {suffix!r}"
    return None


def s3_path_problem(path: str) -> str | None:
    match = S3_PATH.fullmatch(path)
    if not match:
        return f"{path!r} is not an S3 path (s3://bucket[/prefix])"
    if match["prefix"] and (problem := path_segments_problem(match["prefix"], leading_slash=True)):
        return problem
    if problem := bucket_problem(match["bucket"]):
        return problem
    prefix_bytes = len((match["prefix"] or "").lstrip("/").encode("utf-8"))
    if prefix_bytes > MAX_S3_KEY_BYTES - EXPORT_PATH_ROOM:
        return (
            f"the prefix is {prefix_bytes} bytes: exported keys (prefix + the file's path, S3 allows "
            f"{MAX_S3_KEY_BYTES} bytes) need {EXPORT_PATH_ROOM} for the paths below it; at most "
            f"{MAX_S3_KEY_BYTES - EXPORT_PATH_ROOM} bytes"
        )
    return None


def vpc_cidr_problem(cidr: str) -> str | None:
    net, problem = cidr_problem(cidr, ipv4_only=True)
    if problem or net is None:
        return problem
    if net.prefixlen != 16:
        return f"{cidr} must be a private IPv4 /16 (the subnet layout needs the space)"
    if not (isinstance(net, ipaddress.IPv4Network) and any(net.subnet_of(space) for space in _RFC1918)):
        kind = next(
            (
                label
                for label, flag in (
                    ("loopback", net.is_loopback),
                    ("link-local", net.is_link_local),
                    ("multicast", net.is_multicast),
                    ("reserved", net.is_reserved or net.is_unspecified),
                    ("public", net.is_global),
                )
                if flag
            ),
            "not private",
        )
        return f"{cidr} is {kind}; use a private /16 of 10.0.0.0/8, 172.16.0.0/12 or 192.168.0.0/16"
    return None


def public_cidrs_problem(cidrs: list[str]) -> str | None:
    """Refuse CIDRs that are not blocks, more than EKS accepts, and any set whose union covers a whole
    address family."""
    if len(cidrs) > MAX_PUBLIC_ACCESS_CIDRS:
        return (
            f"{len(cidrs)} CIDRs is more than EKS accepts for the public endpoint ({MAX_PUBLIC_ACCESS_CIDRS})"
        )
    v4: list[ipaddress.IPv4Network] = []
    v6: list[ipaddress.IPv6Network] = []
    ipv6: str | None = None
    for cidr in cidrs:
        net, problem = cidr_problem(cidr, ipv4_only=False)
        if problem or net is None:
            return problem
        if net.version == 6:
            ipv6 = ipv6 or cidr
        if isinstance(net, ipaddress.IPv4Network):
            v4.append(net)
        else:
            v6.append(net)
    open_families = [
        everything
        for everything, union in (
            ("0.0.0.0/0", list(ipaddress.collapse_addresses(v4))),
            ("::/0", list(ipaddress.collapse_addresses(v6))),
        )
        if any(net.prefixlen == 0 for net in union)
    ]
    if open_families:
        everything = open_families[0]
        written = ", ".join(cidrs)
        covers = "" if written == everything else f" (the union of {written} covers it)"
        return f"{everything} would open the API server to the internet{covers}"
    if ipv6:  # the cluster is IPv4: an IPv6 block would be accepted here and admit no one there
        return f"{ipv6} is an IPv6 block; the cluster is IPv4, so only IPv4 CIDRs apply"
    return None
