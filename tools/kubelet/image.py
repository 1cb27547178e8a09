"""The one image every container here runs: this checkout and its virtualenv, standing in for the
trainer image (Dockerfile). A container's command is looked up on the image's PATH, which puts this
virtualenv's bin first (python, ft_launcher); PYTHONPATH is the checkout (the image's /workspace), and a
container without workingDir starts there. The rest of the environment is this process's own, less what
would confuse a launcher (a torch elastic agent's variables), as the local harness does (tools/demo.py
process_env): the test session's marker travels, so tests/orphans.py sees a leaked process.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
_DROPPED = ("TORCHELASTIC", "MASTER_", "RANK", "LOCAL_RANK", "WORLD_SIZE", "GROUP_RANK", "KUBECONFIG")


def image_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(_DROPPED)}
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '/usr/bin:/bin')}"
    env["PYTHONPATH"] = str(REPO)
    return env
