"""Install NVIDIA Resiliency Extension (NVRx) into this venv, the release the image ships.

NVRx 0.5-0.7 publish only `cp312 manylinux_2_39` wheels; this machine has Python 3.11 and glibc 2.36, so
pip resolves a plain requirement to 0.4.1. The 0.7 wheel's only compiled module is the CUPTI straggler
detector (imported lazily, never by the trainer); everything the trainer uses is pure Python and runs on
3.11. So: download the wheel for the image's platform, unpack it with --target into VENV/nvrx, put that
folder on the venv's path with a .pth file, link its console scripts (ft_launcher) next to the venv's
python, then install the wheel's own Requires-Dist normally with torch pinned to the local CPU build
(an unpinned torch may pull a multi-GB CUDA build). Idempotent: a matching install is left as it is.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import sysconfig
from importlib import metadata
from pathlib import Path

DIST = "nvidia-resiliency-ext"
WHEEL_PLATFORM = ["--platform", "manylinux_2_39_x86_64", "--python-version", "3.12"]
WHEEL_ABI = ["--implementation", "cp", "--abi", "cp312"]


def _pip(*args: str) -> None:
    cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--quiet", *args]
    subprocess.run(cmd, check=True)


def _installed_version(target: Path) -> str | None:
    dists = list(metadata.distributions(path=[str(target)]))
    return next((d.version for d in dists if d.metadata["Name"] == DIST), None)


def _requirements(target: Path, pins: dict[str, str]) -> list[str]:
    """The wheel's Requires-Dist without extras, with `pins` replacing the named packages' specifiers."""
    dist = next(d for d in metadata.distributions(path=[str(target)]) if d.metadata["Name"] == DIST)
    reqs = []
    for req in dist.requires or []:
        if "extra ==" in req:
            continue
        name = re.split(r"[\s<>=!~;\[(]", req, maxsplit=1)[0]
        reqs.append(f"{name}=={pins[name]}" if name in pins else req)
    return reqs


def install(version: str, torch_version: str) -> Path:
    purelib = Path(sysconfig.get_paths()["purelib"])
    venv = Path(sys.prefix)
    target = venv / "nvrx"
    if _installed_version(purelib) is not None:
        # A venv set up before the move to 0.7 has pip's 0.4.1 in site-packages, which comes before the
        # .pth folder on sys.path and would shadow it.
        _pip("uninstall", "--yes", DIST)
    if _installed_version(target) != version:
        _pip(
            "install",
            "--no-deps",
            "--only-binary=:all:",
            *WHEEL_PLATFORM,
            *WHEEL_ABI,
            "--upgrade",
            "--target",
            str(target),
            f"{DIST}=={version}",
        )
    (purelib / "nvidia_resiliency_ext.pth").write_text(f"{target}\n")
    bindir = Path(sys.executable).parent
    for script in sorted((target / "bin").glob("*")):
        link = bindir / script.name
        if link.is_symlink() or link.exists():
            link.unlink()
        # The wheel's scripts start with `#!python`, rewritten by pip only for the wheel's own platform.
        text = script.read_text()
        if text.startswith("#!"):
            text = f"#!{sys.executable}\n" + text.split("\n", 1)[1]
        link.write_text(text)
        link.chmod(0o755)
    _pip("install", *_requirements(target, {"torch": torch_version}))
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--version", default="0.7.0")
    parser.add_argument("--torch", default="2.13.0", help="the torch pin for NVRx's requirements")
    args = parser.parse_args(argv)
    target = install(args.version, args.torch)
    check = f"import nvidia_resiliency_ext, importlib.metadata as m; print(m.version({DIST!r}))"
    out = subprocess.run(
        [sys.executable, "-c", check],
        check=True,
        capture_output=True,
        text=True,
    )
    found = out.stdout.strip()
    if found != args.version:
        print(f"error: {DIST} {found} is imported, not {args.version} from {target}", file=sys.stderr)
        return 1
    print(f"installed {DIST} {found} in {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
