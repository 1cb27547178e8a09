"""What can be checked of the trainer image without a Docker engine (none on this machine)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from tests.helpers import REPO_ROOT

DOCKERFILE = REPO_ROOT / "Dockerfile"
DOCKERIGNORE = REPO_ROOT / ".dockerignore"
# Trainer dependencies the base image provides (a CUDA torch and the numpy its packages were built with).
FROM_BASE = {"torch", "numpy"}


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of the Dockerfile, continuation lines joined, comments dropped."""
    lines = [ln for ln in DOCKERFILE.read_text().splitlines() if not ln.lstrip().startswith("#")]
    joined = re.sub(r"\\\n", " ", "\n".join(lines))
    out = []
    for line in joined.splitlines():
        if line.strip():
            word, _, rest = line.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def copy_sources() -> list[str]:
    sources = []
    for word, rest in instructions():
        if word in ("COPY", "ADD"):
            parts = [p for p in rest.split() if not p.startswith("--")]
            sources.extend(parts[:-1])
    return sources


def _pattern_regex(pattern: str) -> str:
    """A .dockerignore pattern as a regex: `**/` any directories (or none), `*` and `?` within a name."""
    out, i = "", 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            out, i = out + ".*", i + 2
        elif pattern[i] in "*?":
            out, i = out + ("[^/]*" if pattern[i] == "*" else "[^/]"), i + 1
        else:
            out, i = out + re.escape(pattern[i]), i + 1
    return out


def ignored(path: str, patterns: list[str]) -> bool:
    """Docker's .dockerignore rule: the last pattern matching the path or one of its parents decides."""
    parts = path.strip("/").split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    verdict = False
    for raw in patterns:
        negate = raw.startswith("!")
        regex = _pattern_regex((raw[1:] if negate else raw).strip().strip("/"))
        if any(re.fullmatch(regex, c) for c in candidates):
            verdict = not negate
    return verdict


def dockerignore_patterns() -> list[str]:
    lines = DOCKERIGNORE.read_text().splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.strip().startswith("#")]


def test_base_image_pinned_by_tag() -> None:
    (base_arg,) = [rest for word, rest in instructions() if word == "ARG" and rest.startswith("BASE_IMAGE=")]
    image = base_arg.split("=", 1)[1]
    name, _, tag = image.rpartition(":")
    assert name and tag and tag != "latest", image
    assert instructions()[1] == ("FROM", "${BASE_IMAGE}")


def test_copy_sources_exist() -> None:
    sources = copy_sources()
    assert sources, "the Dockerfile copies nothing"
    for source in sources:
        assert (REPO_ROOT / source).exists(), f"COPY source {source} does not exist"


def test_dockerignore_keeps_what_the_dockerfile_copies() -> None:
    patterns = dockerignore_patterns()
    for source in copy_sources():
        assert not ignored(source, patterns), f".dockerignore drops {source}"
        path = REPO_ROOT / source
        if path.is_dir():
            kept = [p for p in path.rglob("*.py") if not ignored(str(p.relative_to(REPO_ROOT)), patterns)]
            assert kept, f".dockerignore drops every Python file under {source}"
    # and keeps the rest of the repository out of the context
    for other in ("infra/config.py", ".venv/bin/python", "node_modules/x", "cdk.out/a.json"):
        assert ignored(other, patterns), f".dockerignore lets {other} into the build context"


def test_ignore_matcher_follows_docker_rules() -> None:
    patterns = ["*", "!trainer/", "**/__pycache__"]
    assert ignored("infra/app.py", patterns)
    assert not ignored("trainer/reference/model.py", patterns)
    assert ignored("trainer/__pycache__/model.cpython-312.pyc", patterns)
    assert not ignored("keep.txt", [*patterns, "!keep.txt"])


def test_trainer_dependencies_are_installed() -> None:
    """Every runtime dependency of the trainer extra is installed by the Dockerfile or comes with the base."""
    pyproject = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
    deps = pyproject["project"]["optional-dependencies"]["trainer"]
    text = DOCKERFILE.read_text()
    for dep in deps:
        name = re.split(r"[=<>~!\[ ]", dep, maxsplit=1)[0]
        if name in FROM_BASE:
            continue
        assert f'"{name}==' in text, f"{name} (trainer dependency) is not installed in the image"
    assert "pip install --no-deps ." in text


def test_nvrx_0_7_and_efa_with_aws_ofi_nccl() -> None:
    args = dict(rest.split("=", 1) for word, rest in instructions() if word == "ARG" and "=" in rest)
    assert re.fullmatch(r"0\.7\.\d+", args["NVRX_VERSION"])
    assert re.fullmatch(r"\d+\.\d+\.\d+", args["EFA_INSTALLER_VERSION"])
    text = DOCKERFILE.read_text()
    assert "--skip-kmod" in text
    assert "libnccl-net" in text  # the build checks aws-ofi-nccl is there
    envs = " ".join(rest for word, rest in instructions() if word == "ENV")
    assert "NCCL_NET_PLUGIN=ofi" in envs
    assert "/opt/amazon/ofi-nccl/lib" in envs


@pytest.mark.parametrize("path", ["Dockerfile", "pyproject.toml", "README.md"])
def test_context_files_exist(path: str) -> None:
    assert Path(REPO_ROOT / path).is_file()
