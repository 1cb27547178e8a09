"""The replace block of the wrapper module controlplane/go.mod, generated from Kubernetes' own go.mod.

k8s.io/kubernetes points each staging module (k8s.io/api, k8s.io/apiserver, ...) at `./staging/src/...`,
which its published module does not contain; a module that requires it must replace each of them by the
published release of the same minor, v0.<minor>.<patch>. The list of staging modules changes between
Kubernetes releases, so it is read from that release's go.mod (in the Go module cache once downloaded),
never written by hand.

    python -m tools.controlplane.gomod --version v1.35.5   # rewrite the require and replace lines
    cd controlplane && go mod tidy                           # then let Go resolve the rest
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

GO_MOD = Path(__file__).resolve().parents[2] / "controlplane" / "go.mod"
KUBERNETES = "k8s.io/kubernetes"
_STAGING = re.compile(r"^\s*(k8s\.io/[\w.-]+)\s+=>\s+\./staging/src/\1\s*$", re.MULTILINE)
_REPLACE_BLOCK = re.compile(r"^replace \(\n.*?^\)\n", re.MULTILINE | re.DOTALL)
_REQUIRE = re.compile(rf"^(\s*{re.escape(KUBERNETES)}\s+)(v[\d.]+)", re.MULTILINE)


class GoModError(RuntimeError):
    pass


def kubernetes_version(go_mod: str) -> str:
    found = _REQUIRE.search(go_mod)
    if not found:
        raise GoModError(f"no `require {KUBERNETES} vX.Y.Z` line")
    return found.group(2)


def staging_modules(kubernetes_go_mod: str) -> list[str]:
    """The modules Kubernetes' go.mod replaces by its ./staging folders, in its order."""
    modules = _STAGING.findall(kubernetes_go_mod)
    if not modules:
        raise GoModError("Kubernetes' go.mod replaces no module by ./staging/src: not its go.mod?")
    return modules


def replace_block(modules: list[str], version: str) -> str:
    """Each staging module replaced by its published v0.<minor>.<patch> (Kubernetes v1.<minor>.<patch>)."""
    major, _, rest = version.partition(".")
    if major != "v1" or not rest:
        raise GoModError(f"{version}: not a Kubernetes v1.X.Y version")
    published = f"v0.{rest}"
    return "replace (\n" + "".join(f"\t{m} => {m} {published}\n" for m in modules) + ")\n"


def render(go_mod: str, kubernetes_go_mod: str, version: str) -> str:
    """The wrapper go.mod requiring Kubernetes `version`, with the replace block for it."""
    if not _REPLACE_BLOCK.search(go_mod):
        raise GoModError("the wrapper go.mod has no `replace (` block to rewrite")
    block = replace_block(staging_modules(kubernetes_go_mod), version)
    return _REPLACE_BLOCK.sub(lambda _: block, _REQUIRE.sub(lambda m: m.group(1) + version, go_mod))


def module_cache() -> Path:
    """Go's module cache: `go env GOMODCACHE`, or Go's default when no Go is installed."""
    try:
        out = subprocess.run(["go", "env", "GOMODCACHE"], capture_output=True, text=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        gopath = os.environ.get("GOPATH", "").split(os.pathsep)[0] or str(Path.home() / "go")
        return Path(os.environ.get("GOMODCACHE") or Path(gopath) / "pkg" / "mod")
    return Path(out.stdout.strip())


def cached_kubernetes_go_mod(version: str, cache: Path | None = None) -> Path | None:
    """Kubernetes' go.mod at `version` from the Go module cache, or None when it was never downloaded."""
    root = cache or module_cache()
    for path in (
        root / "cache" / "download" / KUBERNETES / "@v" / f"{version}.mod",
        root / f"{KUBERNETES}@{version}" / "go.mod",
    ):
        if path.is_file():
            return path
    return None


def download_kubernetes_go_mod(version: str) -> Path:
    """Fetch only Kubernetes' go.mod (not the module) through the module proxy."""
    subprocess.run(
        ["go", "mod", "download", "-json", f"{KUBERNETES}@{version}"], capture_output=True, check=False
    )
    found = cached_kubernetes_go_mod(version)
    if found is None:
        raise GoModError(f"could not download {KUBERNETES}@{version} (is the version published?)")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tools.controlplane.gomod", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--version", help="the Kubernetes version to require (default: the one go.mod requires)"
    )
    parser.add_argument("--go-mod", type=Path, default=GO_MOD, help="the wrapper module's go.mod")
    args = parser.parse_args(argv)
    try:
        current = args.go_mod.read_text()
        version = args.version or kubernetes_version(current)
        upstream = cached_kubernetes_go_mod(version) or download_kubernetes_go_mod(version)
        args.go_mod.write_text(render(current, upstream.read_text(), version))
    except (OSError, GoModError, subprocess.CalledProcessError) as error:
        print(f"gomod: {error}", file=sys.stderr)
        return 2
    print(f"{args.go_mod}: requires {KUBERNETES} {version}; now run `go mod tidy` in {args.go_mod.parent}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
