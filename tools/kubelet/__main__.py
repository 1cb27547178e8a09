"""`python -m tools.kubelet --kubeconfig FILE [--gpu-nodes N] [--instance-type T] [--root DIR]`: register
N GPU nodes and a system node with the API server of FILE and run the pods bound to them until
interrupted (Ctrl-C or SIGTERM: every pod's processes are killed, the Nodes stay, NotReady after the node
lifecycle controller's grace period)."""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import sys
import threading
from pathlib import Path

from tools.kubelet.kubelet import ProcessKubelet
from tools.kubelet.nodes import gpu_node, instance_facts, system_node


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.kubelet", description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", type=Path, required=True, help="the API server's kubeconfig")
    parser.add_argument("--gpu-nodes", type=int, default=2, help="GPU nodes to register")
    parser.add_argument("--instance-type", default="p5.48xlarge", help="their instance type")
    parser.add_argument(
        "--gpus", type=int, default=None, help="nvidia.com/gpu per node (default: the type's)"
    )
    parser.add_argument(
        "--host-dir", action="append", default=[], help="a hostPath folder every GPU node has"
    )
    parser.add_argument("--root", type=Path, default=Path("out/kubelet"), help="the nodes' folders")
    args = parser.parse_args(argv)
    if args.gpu_nodes < 0:
        parser.error("--gpu-nodes: must be >= 0")
    if not args.kubeconfig.is_file():
        parser.error(f"--kubeconfig: {args.kubeconfig} is not a file")
    try:
        instance_facts(args.instance_type)
    except ValueError as exc:
        parser.error(f"--instance-type: {exc}")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    nodes = [
        gpu_node(f"gpu-node-{i}", args.instance_type, gpus=args.gpus, host_dirs=tuple(args.host_dir))
        for i in range(args.gpu_nodes)
    ]
    nodes.append(system_node("system-node-0"))
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    with ProcessKubelet(args.kubeconfig, nodes, args.root.resolve()):
        print(f"kubelet: {', '.join(n.name for n in nodes)} registered; Ctrl-C stops", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            done.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
