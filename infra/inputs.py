"""Input primitives of the teams file: one rule per class of value, used by every field of that class.

Each function returns None when the value is acceptable, else why not (the caller names the field), or, for
the file and YAML readers, raises `InputError` with a line that names the place. The rule they share:
a value is accepted only if the next layer (CDK, CloudFormation, AWS) reads it exactly as written.

- ASCII only: Python's `\\d`, `\\w` and `str.isdigit` accept Arabic-Indic, fullwidth and Cyrillic
  characters that AWS refuses at deploy time; every pattern here is compiled with re.ASCII.
- Regions: a known region (its partition known with it), so a typo stops at synth, not at deploy.
- CIDRs: parsed strictly and required in canonical form (`10.0.0.0/16`, not `10.0.0.0/255.255.0.0`,
  `10.0.0.0/0.0.255.255` or `10.0.0.0/016`), because CDK's own CIDR parser accepts only that form.
- Paths: no `.`, `..` or empty segments.
- The file: a regular file (no FIFO, device or symlink loop), at most MAX_TEAMS_FILE_BYTES, read through
  one descriptor; YAML whose aliases expand to at most ALIAS_EXPANSION_BUDGET nodes and whose integers
  fit in 64 bits, both checked on the event stream before anything is built or walked.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import re
import stat
from pathlib import Path
from typing import Any

import yaml

MAX_TEAMS_FILE_BYTES = 1 << 20  # 1 MiB: a few hundred teams; anything larger is not a teams file
ALIAS_EXPANSION_BUDGET = 20_000
"""Nodes all aliases of the document together may stand for (a whole 100-team file is ~5,000 nodes)."""
MAX_INT_DIGITS = 19  # int64; no field of the file needs more, and 5,000 digits would be a traceback


class InputError(ValueError):
    """A teams-file input refused before it is parsed; str() is one line naming the place."""


# ------------------------------------------------------------------------------------- ASCII values

ACCOUNT_ID = re.compile(r"[0-9]{12}", re.ASCII)
ADDON_VERSION = re.compile(r"v[0-9]+\.[0-9]+\.[0-9]+-eksbuild\.[0-9]+", re.ASCII)
# IAM names: letters, digits and +=,.@_- (and / for paths), ASCII only.
IAM_PRINCIPAL_ARN = re.compile(
    r"arn:(?P<partition>aws|aws-cn|aws-us-gov):iam::(?P<account>[0-9]{12}):"
    r"(?P<kind>role|user)/(?P<name>[A-Za-z0-9_+=,.@/-]{1,512})",
    re.ASCII,
)


def ascii_digits_problem(value: str, count: int, what: str) -> str | None:
    """`value` is exactly `count` ASCII digits (not Arabic-Indic, fullwidth or superscript digits)."""
    if ACCOUNT_ID.fullmatch(value) if count == 12 else re.fullmatch(f"[0-9]{{{count}}}", value, re.ASCII):
        return None
    if not value.isascii():
        return f"{value!r} is not a {what}: only ASCII digits 0-9 are accepted"
    return f"{value!r} is not a {what} ({count} digits)"


def non_ascii_problem(value: str) -> str | None:
    """Why a name that must be ASCII is not (the first offending character), or None."""
    for char in value:
        if not char.isascii():
            return f"{value!r} contains the non-ASCII character {char!r} (U+{ord(char):04X})"
    return None


# ------------------------------------------------------------------------------------------- regions

# Regions by partition (AWS's published list, 2026-11). ISO and sovereign partitions are not supported.
REGIONS_BY_PARTITION: dict[str, tuple[str, ...]] = {
    "aws": (
        "af-south-1",
        "ap-east-1",
        "ap-east-2",
        "ap-northeast-1",
        "ap-northeast-2",
        "ap-northeast-3",
        "ap-south-1",
        "ap-south-2",
        "ap-southeast-1",
        "ap-southeast-2",
        "ap-southeast-3",
        "ap-southeast-4",
        "ap-southeast-5",
        "ap-southeast-6",
        "ap-southeast-7",
        "ca-central-1",
        "ca-west-1",
        "eu-central-1",
        "eu-central-2",
        "eu-north-1",
        "eu-south-1",
        "eu-south-2",
        "eu-west-1",
        "eu-west-2",
        "eu-west-3",
        "il-central-1",
        "me-central-1",
        "me-south-1",
        "mx-central-1",
        "sa-east-1",
        "us-east-1",
        "us-east-2",
        "us-west-1",
        "us-west-2",
    ),
    "aws-cn": ("cn-north-1", "cn-northwest-1"),
    "aws-us-gov": ("us-gov-east-1", "us-gov-west-1"),
}
PARTITION_OF_REGION = {r: p for p, regions in REGIONS_BY_PARTITION.items() for r in regions}
_REGION_SHAPE = re.compile(r"[a-z]{2}(-[a-z]+)+-[0-9]+", re.ASCII)


def region_problem(region: str) -> str | None:
    if region in PARTITION_OF_REGION:
        return None
    if problem := non_ascii_problem(region):
        return f"not an AWS region name: {problem}"
    if "-iso" in region and _REGION_SHAPE.fullmatch(region):
        return f"{region} is an ISO (air-gapped) region; its partitions are not supported"
    if region.startswith("eusc-") and _REGION_SHAPE.fullmatch(region):
        return f"{region} is in the European Sovereign Cloud partition, which is not supported"
    hint = f"; did you mean {close}?" if (close := _closest_region(region)) else ""
    if not _REGION_SHAPE.fullmatch(region):
        return f"{region!r} is not an AWS region name (e.g. us-east-2){hint}"
    return f"{region!r} is not a known AWS region{hint}"


def _closest_region(region: str) -> str | None:
    import difflib

    close = difflib.get_close_matches(region, list(PARTITION_OF_REGION), n=1, cutoff=0.75)
    return close[0] if close else None


def partition_of(region: str) -> str:
    return PARTITION_OF_REGION.get(region, "aws")


# --------------------------------------------------------------------------------------------- CIDRs


Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def cidr_problem(cidr: str, *, ipv4_only: bool) -> tuple[Network | None, str | None]:
    """(network, None) for a CIDR block written in canonical form, else (None, why)."""
    if problem := non_ascii_problem(cidr):
        return None, f"not a CIDR block: {problem}"
    _address, slash, length = cidr.partition("/")
    if not slash or not re.fullmatch(r"0|[1-9][0-9]{0,2}", length, re.ASCII):
        return None, f"{cidr!r} is not a CIDR block (address/prefix length, e.g. 10.0.0.0/16)"
    try:
        net = ipaddress.ip_network(cidr, strict=True)
    except ValueError as exc:
        return None, f"{cidr!r} is not a CIDR block ({exc})"
    if ipv4_only and net.version != 4:
        return None, f"{cidr} is an IPv6 block; the cluster is IPv4, so only IPv4 CIDRs apply"
    if str(net) != cidr:  # e.g. an IPv6 block written with leading zeros or uppercase
        return None, f"{cidr!r} is not in canonical form; write {net}"
    return net, None


# --------------------------------------------------------------------------------------------- paths


def path_segments_problem(path: str, *, leading_slash: bool) -> str | None:
    """An absolute (or relative) path with no `.`, `..` or empty segments; one trailing / is allowed."""
    if leading_slash and not path.startswith("/"):
        return f"{path!r} must start with /"
    body = path[1:] if leading_slash else path
    if not body:  # "/" itself
        return None
    if body.endswith("/"):
        body = body[:-1]
    for segment in body.split("/"):
        if segment in ("", ".", ".."):
            shown = "an empty segment (//)" if segment == "" else f"a {segment!r} segment"
            return f"{path!r} has {shown}; write the path without it"
    return None


# ------------------------------------------------------------------------------------------ the file


def read_teams_bytes(path: Path) -> bytes:
    """The file's bytes, read through one descriptor, if it is a regular file within the size cap."""
    try:
        # O_NONBLOCK: a FIFO would otherwise block the open until a writer appears.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise InputError(f"{path}: teams file not found") from None
    except OSError as exc:
        why = "a symlink loop" if exc.errno == errno.ELOOP else exc.strerror
        raise InputError(f"{path}: cannot read the teams file ({why})") from None
    except ValueError:
        raise InputError(f"{path!r}: not a valid path") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = "a directory" if stat.S_ISDIR(st.st_mode) else "not a regular file (a FIFO or device?)"
            raise InputError(f"{path}: the teams file is {kind}")
        if st.st_size > MAX_TEAMS_FILE_BYTES:
            raise InputError(
                f"{path}: {st.st_size} bytes is more than a teams file may have ({MAX_TEAMS_FILE_BYTES})"
            )
        # Read at most one byte past the cap: a file that grows meanwhile cannot make this unbounded.
        chunks, got = [], 0
        while chunk := os.read(fd, MAX_TEAMS_FILE_BYTES + 1 - got):
            chunks.append(chunk)
            got += len(chunk)
            if got > MAX_TEAMS_FILE_BYTES:
                raise InputError(f"{path}: the teams file grew past {MAX_TEAMS_FILE_BYTES} bytes while read")
        return b"".join(chunks)
    finally:
        os.close(fd)


# A plain scalar YAML 1.1 reads as an integer starts with a digit (after a sign): decimal, 0x/0o/0b, 1_000,
# sexagesimal 1:30. PyYAML's int() of 5,000 digits raises a ValueError that is no YAMLError (a traceback).
_INT_LIKE = re.compile(r"[-+]?[0-9][0-9a-fA-FxXoObB_:]*", re.ASCII)


def check_yaml_events(text: str, loader: Any, source: str) -> None:
    """Refuse, before any object is built, a document whose aliases expand past ALIAS_EXPANSION_BUDGET
    nodes (an alias bomb: every later walk would be exponential in the file's size) and a plain number
    too long to be any field's value. Linear in the events."""
    expanded: dict[str, int] = {}  # anchor -> nodes its value expands to
    open_anchors: list[str | None] = []
    sizes: list[int] = []
    aliased = 0  # nodes the aliases met so far stand for
    for event in yaml.parse(text, Loader=loader):
        line = event.start_mark.line + 1
        if isinstance(event, yaml.AliasEvent):
            # An unknown anchor: the parser reports it; one inside its own value: the loader does.
            count = 1 if event.anchor in open_anchors else expanded.get(event.anchor, 1)
            aliased += count
        elif isinstance(event, yaml.ScalarEvent):
            too_long = len(event.value) > MAX_INT_DIGITS + 3  # room for a sign and 0x
            if not event.style and too_long and _INT_LIKE.fullmatch(event.value):  # plain: None or ""
                raise InputError(
                    f"{source}: line {line}: the number {event.value[:20]}... has {len(event.value)} "
                    f"characters; no field takes more than {MAX_INT_DIGITS} digits"
                )
            count = 1
            if event.anchor:
                expanded[event.anchor] = 1
        elif isinstance(event, yaml.CollectionStartEvent):
            open_anchors.append(event.anchor)
            sizes.append(1)
            continue
        elif isinstance(event, yaml.CollectionEndEvent):
            anchor = open_anchors.pop()
            count = sizes.pop()
            if anchor:
                expanded[anchor] = count
            if sizes:
                sizes[-1] += count
            continue
        else:
            continue
        if sizes:
            sizes[-1] += count
        if aliased > ALIAS_EXPANSION_BUDGET:
            raise InputError(
                f"{source}: line {line}: its aliases expand to more than {ALIAS_EXPANSION_BUDGET} values "
                "through YAML aliases or merge keys; write the values out"
            )
