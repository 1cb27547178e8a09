"""`python -m tools.controlplane up --dir D`: start a local control plane under D, print the admin
kubeconfig's path, run until SIGTERM or SIGINT, then stop every component.

    export KUBECONFIG=$(python -m tools.controlplane up --dir /tmp/cp | head -1)   # in another shell
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from pathlib import Path

from tools.controlplane.launch import ControlPlaneError, running_control_plane


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.controlplane", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    up = sub.add_parser("up", help="start a control plane and run until SIGTERM/SIGINT")
    up.add_argument("--dir", type=Path, required=True, help="work folder: certificates, etcd data, logs")
    up.add_argument(
        "--bin-dir",
        type=Path,
        default=None,
        help="where the four binaries are (default: .tools/controlplane/bin)",
    )
    up.add_argument("--no-controllers", action="store_true", help="no kube-controller-manager")
    up.add_argument("--no-scheduler", action="store_true", help="no kube-scheduler")
    args = parser.parse_args(argv)

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        with running_control_plane(
            args.dir,
            bin_dir=args.bin_dir,
            controllers=not args.no_controllers,
            scheduler=not args.no_scheduler,
        ) as plane:
            print(plane.kubeconfig, flush=True)
            startup = json.loads((plane.workdir / "startup.json").read_text())
            print(
                f"{plane.server} ready in {startup['seconds']['total']:.1f} s;"
                f" logs in {plane.workdir / 'logs'}",
                file=sys.stderr,
                flush=True,
            )
            stop.wait()
    except ControlPlaneError as error:
        print(f"control plane: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
