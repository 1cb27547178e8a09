"""The kubelet's HTTPS endpoint, for what the API server proxies to a node: `pods/log`.

The API server serves `GET /api/v1/namespaces/<ns>/pods/<pod>/log` by calling the pod's node at its
InternalIP and `daemonEndpoints.kubeletEndpoint.Port`: `GET /containerLogs/<ns>/<pod>/<container>`
with `follow`, `previous`, `tailLines` and `limitBytes`, authenticating with its kubelet client
certificate. This server answers that path from the container's log file (tools/kubelet/sandbox.py),
raw lines as `kubectl logs` prints them; `follow` streams until the container's run ends. It serves
every node of the kubelet on one port (they share 127.0.0.1). It does not check the caller's client
certificate (the real kubelet authorizes through the API server); it listens on 127.0.0.1 only.
Its serving certificate is self-signed (openssl): the API server is not given a CA for kubelets, as on
a cluster whose kubelets serve self-signed certificates, and does not verify it.
"""

from __future__ import annotations

import http.server
import socketserver
import ssl
import subprocess
import threading
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path

#: (namespace, pod, container, previous) -> (log file or None, is the run still going?)
LogLookup = Callable[[str, str, str, bool], tuple[Path | None, Callable[[], bool]]]


def self_signed(folder: Path) -> tuple[Path, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    cert, key = folder / "kubelet.crt", folder / "kubelet.key"
    if not cert.is_file():
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
             "-keyout", str(key), "-out", str(cert), "-days", "30", "-subj", "/CN=process-kubelet",
             "-addext", "subjectAltName=IP:127.0.0.1"],
            check=True, capture_output=True,
        )  # fmt: skip
    return cert, key


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True


class LogServer:
    """`with LogServer(lookup, folder) as server: server.port`."""

    def __init__(self, lookup: LogLookup, cert_dir: Path) -> None:
        self._lookup = lookup
        cert, key = self_signed(cert_dir)
        handler = self._handler()
        self._server = _Server(("127.0.0.1", 0), handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(cert, key)
        self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
        self._thread = threading.Thread(target=self._server.serve_forever, name="kubelet-logs", daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def __enter__(self) -> LogServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def _handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        lookup = self._lookup

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # chunked transfer (a followed log has no length)

            def log_message(self, *args: object) -> None:  # quiet: the API server polls
                return

            def do_GET(self) -> None:
                url = urllib.parse.urlsplit(self.path)
                parts = url.path.strip("/").split("/")
                if len(parts) != 4 or parts[0] != "containerLogs":
                    self.send_error(404, "only /containerLogs/<namespace>/<pod>/<container> is served")
                    return
                query = urllib.parse.parse_qs(url.query)
                flag = lambda name: query.get(name, ["false"])[0] in ("true", "1")  # noqa: E731
                path, still_running = lookup(parts[1], parts[2], parts[3], flag("previous"))
                if path is None:
                    self.send_error(404, f"no log for container {parts[3]} of pod {parts[1]}/{parts[2]}")
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                data = path.read_bytes() if path.is_file() else b""
                if "tailLines" in query:
                    lines = data.splitlines(keepends=True)
                    data = (
                        b"".join(lines[-int(query["tailLines"][0]) :]) if int(query["tailLines"][0]) else b""
                    )
                if "limitBytes" in query:
                    data = data[: int(query["limitBytes"][0])]
                try:
                    self._chunk(data)
                    offset = path.stat().st_size if path.is_file() else 0
                    while flag("follow") and not flag("previous"):
                        running = still_running()
                        size = path.stat().st_size if path.is_file() else 0
                        if size > offset:
                            with open(path, "rb") as fh:
                                fh.seek(offset)
                                self._chunk(fh.read(size - offset))
                            offset = size
                        elif not running:
                            break
                        else:
                            time.sleep(0.2)
                    self.wfile.write(b"0\r\n\r\n")
                    self.close_connection = True
                except (BrokenPipeError, ConnectionResetError, ssl.SSLError):
                    return

            def _chunk(self, data: bytes) -> None:
                if data:
                    self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                    self.wfile.flush()

        return Handler
