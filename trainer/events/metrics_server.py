"""The HTTP endpoint of the trainer's live metrics (trainer/events/metrics_export.py): one per pod, on
local rank 0.

The endpoint runs in a small child process of local rank 0 (`python -m trainer.events.metrics_server`, niced):
reading and folding the event files never takes the GIL or a core from a training step. It imports no
torch (prometheus_client and the standard library only), so it starts in a fraction of a second. The
parent talks to it over the child's stdin/stdout, one line at a time: the child answers `ready <port>` or
`error <errno> <message>` once it bound the port (a taken port is the parent's OSError, as before), a
`linger <seconds>` line is answered `lingered 1|0`, and the child exits when its stdin closes, i.e. when
the training process exits or dies (no orphan holds the port for the next worker).

A small threaded WSGI server instead of prometheus_client's start_http_server, for one reason: it knows
when a response has been written in full, so a completed run can stay up exactly until the collector
holds its final figures (`linger`).
"""

from __future__ import annotations

import argparse
import contextlib
import errno as errno_mod
import logging
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

from trainer.events.metrics_export import RunCollector

log = logging.getLogger(__name__)


class _ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a scrape in flight never keeps the trainer process alive


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass  # one access-log line per scrape would flood the trainer's log


class _Served:
    """A WSGI response body that reports when the server has written it (WSGI calls close() after)."""

    def __init__(self, body: Iterable[bytes], on_close: Callable[[], None]) -> None:
        self._body, self._on_close = body, on_close

    def __iter__(self) -> Iterator[bytes]:
        return iter(self._body)

    def close(self) -> None:
        self._on_close()


class Endpoint:
    """Serves a RunCollector on http://<addr>:<port>/metrics in this process (port 0 picks a free port).

    The child process runs it; MetricsServer is the training process's handle on that child.
    """

    def __init__(self, out_dir: str | Path, port: int, *, rank: int, addr: str = "0.0.0.0") -> None:
        self.collector = RunCollector(out_dir, rank=rank)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self.collector)
        app = make_wsgi_app(registry)
        self._served = threading.Condition()
        self._started = 0  # requests, numbered as they start
        self._newest_done = 0  # the highest number among the responses sent in full

        def counted(environ: dict[str, Any], start_response: Any) -> _Served:
            with self._served:
                self._started += 1
                number = self._started
            return _Served(app(environ, start_response), lambda: self._done(number))

        self._server = make_server(addr, port, counted, _ThreadingWSGIServer, _QuietHandler)
        self.port = int(self._server.server_port)
        # A short poll: close() (the training process gone) releases the port within it, before a
        # worker restarted from the warm zygote looks for the port (serve_forever's default is 0.5 s).
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), name="metrics", daemon=True
        )
        self._thread.start()

    def _done(self, number: int) -> None:
        with self._served:
            self._newest_done = max(self._newest_done, number)
            self._served.notify_all()

    def linger(self, timeout_s: float) -> bool:
        """After the run's last event: stay up until a request that started after this call has been
        answered in full (or timeout_s passed), so the collector holds the final figures before the pod
        goes away. A request already in flight may have read the log before the last event."""
        if timeout_s <= 0:
            return False
        with self._served:
            mark = self._started
            return self._served.wait_for(lambda: self._newest_done > mark, timeout=timeout_s)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


class MetricsServer:
    """The training process's handle on its metrics endpoint, served by a child process (module doc).

    Create it once per process, outside any in-process restart loop: its child owns a listening socket.
    Raises OSError (errno and message of the child's bind) when the port cannot be bound. A child that
    dies while training runs (killed from outside, the OOM killer) is started again on the same port by a
    watcher thread, at most RESTARTS times: training never waits for it, and the endpoint is back within
    the child's start (a fraction of a second) instead of gone until the next worker restart.
    """

    RESTARTS = 3

    def __init__(self, out_dir: str | Path, port: int, *, rank: int, addr: str = "0.0.0.0") -> None:
        self._args = ["--out-dir", str(out_dir), "--rank", str(rank), "--addr", addr]
        root = str(Path(__file__).resolve().parent.parent)  # the child imports this very trainer package
        self._env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])),
        }
        self._lock = threading.Lock()
        self._closing = False
        self.restarts = 0
        self._proc, self.port = self._spawn(port)
        threading.Thread(target=self._watch, name="metrics-watch", daemon=True).start()

    def _spawn(self, port: int) -> tuple[subprocess.Popen[str], int]:
        cmd = [sys.executable, "-m", "trainer.events.metrics_server", "--port", str(port), *self._args]
        proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1, env=self._env
        )
        assert proc.stdin is not None and proc.stdout is not None
        first = proc.stdout.readline().split(" ", 2)
        if first[0] == "ready":
            return proc, int(first[1])
        proc.wait()
        if first[0] == "error" and len(first) == 3:
            raise OSError(int(first[1]), first[2].strip())
        raise OSError(errno_mod.EIO, f"the metrics endpoint process exited ({proc.returncode})")

    def _watch(self) -> None:
        """Start the child again when it ends while the handle is open (see the class doc)."""
        while True:
            proc = self._proc
            rc = proc.wait()
            with self._lock:
                if self._closing or self.restarts >= self.RESTARTS:
                    return
                self.restarts += 1
                log.warning("metrics endpoint process ended (%s); starting it again on %d", rc, self.port)
                try:
                    self._proc, _ = self._spawn(self.port)
                except OSError as exc:
                    log.warning("metrics endpoint on port %d not restarted: %s", self.port, exc)
                    return

    @classmethod
    def maybe_start(
        cls, out_dir: str | Path, port: int, *, rank: int, local_rank: int
    ) -> MetricsServer | None:
        """The endpoint of this process if it should serve one (local rank 0, port > 0) and can bind it."""
        if port <= 0 or local_rank != 0:
            return None
        try:
            return cls(out_dir, port, rank=rank)
        except OSError as exc:
            log.warning("metrics endpoint on port %d not started: %s", port, exc)
            return None

    def linger(self, timeout_s: float) -> bool:
        """See Endpoint.linger: the child waits for the next full response after this call."""
        if timeout_s <= 0:
            return False
        assert self._proc.stdin is not None and self._proc.stdout is not None
        with self._lock:
            try:
                self._proc.stdin.write(f"linger {timeout_s}\n")
                self._proc.stdin.flush()
                return self._proc.stdout.readline().strip() == "lingered 1"
            except OSError:  # the child is gone: nothing to wait for
                return False

    def close(self) -> None:
        with self._lock:
            self._closing = True
        if self._proc.stdin is not None and not self._proc.stdin.closed:
            with contextlib.suppress(OSError):
                self._proc.stdin.close()  # the child's cue to shut the server down and exit
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


def serve(argv: list[str] | None = None) -> int:
    """The child: bind, say `ready <port>`, serve until stdin closes (see the module doc)."""
    parser = argparse.ArgumentParser(prog="python -m trainer.events.metrics_server")
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--rank", type=int, required=True)
    parser.add_argument("--addr", default="0.0.0.0")
    args = parser.parse_args(argv)
    with contextlib.suppress(OSError):
        os.nice(10)  # below the training processes: a scrape waits, a step never does
    try:
        endpoint = Endpoint(args.out_dir, args.port, rank=args.rank, addr=args.addr)
    except OSError as exc:
        print(f"error {exc.errno or errno_mod.EIO} {exc.strerror or exc}", flush=True)
        return 1
    print(f"ready {endpoint.port}", flush=True)
    try:
        for line in sys.stdin:
            word, _, value = line.strip().partition(" ")
            if word == "linger":
                print(f"lingered {int(endpoint.linger(float(value)))}", flush=True)
    finally:
        endpoint.close()
    return 0


if __name__ == "__main__":
    sys.exit(serve())
