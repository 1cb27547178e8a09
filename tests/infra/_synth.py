"""The synthesized app shared by the infra tests (built once per session in conftest.py): what the image
context holds and the result type the tests read."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from tests.helpers import REPO_ROOT

HERE = Path(__file__).resolve().parent
os.environ.setdefault("JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION", "20")

# What the image context holds: the allow-listed files and decoys .dockerignore must keep out.
IMAGE_ALLOWED = [
    "Dockerfile",
    "pyproject.toml",
    "README.md",
    "trainer/__init__.py",
    "trainer/runtime/train.py",
]
IMAGE_DECOYS = [
    ".venv/bin/python",
    "node_modules/x/index.js",
    "cdk.out/manifest.json",
    "out/demo/x.json",
    ".git/HEAD",
    "infra/config.py",
    "trainer/__pycache__/x.cpython-311.pyc",
]


@dataclass
class SynthResult:
    """The synthesized app: stacks by team name, the output folder and any synth error."""

    app: object
    stacks: dict
    teams: dict
    outdir: Path
    image_dir: Path
    error: Exception | None


def image_context(root: Path) -> Path:
    root.mkdir()
    shutil.copy(REPO_ROOT / ".dockerignore", root / ".dockerignore")
    for rel in IMAGE_ALLOWED + IMAGE_DECOYS:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"# {rel}\n")
    return root
