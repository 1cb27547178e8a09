"""The HTTP endpoint of the trainer's live metrics (trainer/metrics_export.py): one per pod, on local rank 0.

A small threaded WSGI server instead of prometheus_client's start_http_server, for one reason: it knows
when a response has been written in full, so a completed run can stay up exactly until the collector
holds its final figures (`linger`).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

from trainer.metrics_export import RunCollector

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


class MetricsServer:
    """Serves a RunCollector on http://<addr>:<port>/metrics (port 0 picks a free port; read `.port`).

    Create it once per process, outside any in-process restart loop: it owns a listening socket.
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
        self._thread = threading.Thread(target=self._server.serve_forever, name="metrics", daemon=True)
        self._thread.start()

    def _done(self, number: int) -> None:
        with self._served:
            self._newest_done = max(self._newest_done, number)
            self._served.notify_all()

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
