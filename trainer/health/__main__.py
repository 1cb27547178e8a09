"""`python -m trainer.health --socket PATH [...]`: serve the node checks until SIGTERM (the chart's
native sidecar); `python -m trainer.health probe --socket PATH`: exit 0 once something accepts on the
socket (the sidecar's startup probe: the kubelet starts the trainer container only then, and NVRx's
launcher, which looks for the socket once when it starts, finds it). The probe imports neither grpc nor
NVRx."""

from __future__ import annotations

import signal
import socket
import sys
import threading


def probe(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] != "--socket":
        print("usage: python -m trainer.health probe --socket PATH", file=sys.stderr)
        return 2
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(2.0)
        try:
            sock.connect(argv[1])
        except OSError as exc:
            print(f"trainer.health probe: {argv[1]}: {exc}", file=sys.stderr)
            return 1
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["probe"]:
        return probe(argv[1:])
    from trainer.config.flags import FlagParser
    from trainer.config.settings import ConfigError
    from trainer.health.config import add_health_arguments, health_config
    from trainer.health.server import serve

    parser = FlagParser(prog="python -m trainer.health", description=__doc__)
    add_health_arguments(parser)
    try:
        cfg = health_config(parser.parse_args(argv))
    except ConfigError as exc:
        print(exc, file=sys.stderr)
        return 2
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    server = serve(cfg)
    print(f"trainer.health: serving on {cfg.socket}", file=sys.stderr, flush=True)
    stop.wait()
    server.stop(grace=1.0).wait()
    cfg.socket.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
