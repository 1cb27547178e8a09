"""A local HTTP endpoint (127.0.0.1, a free port) serving the Kubernetes API paths tools/cluster_smoke.py
calls, so tests drive the real `kubernetes` client: lists, watch streams, pod logs (followed or not) and
Job patches. Objects are built with the client's own models and serialized with
ApiClient.sanitize_for_serialization, as an API server would send them.

Each kind keeps a history of (event type, object), each visible from a given time on (a scenario plays
out like a cluster's, not all at once); an object's resourceVersion is its position in that history, so
a watch that resumes from a resourceVersion gets exactly the events after it. Selectors are
the equality forms the tool uses (`a=b,c=d` labels, `metadata.name=x` fields).
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

from kubernetes import client

_PATHS = {  # resource (URL segment) -> kind in the history, list kind
    "jobs": ("job", "JobList"),
    "pods": ("pod", "PodList"),
    "events": ("event", "EventList"),
}


class FakeKubeApi:
    """The API objects of one namespace, and what clients asked for."""

    def __init__(self, namespace: str) -> None:
        self.namespace = namespace
        self.history: dict[str, list[tuple[float, str, dict[str, Any]]]] = {k: [] for k, _ in _PATHS.values()}
        self.logs: dict[tuple[str, str], str] = {}
        self.patches: list[tuple[str, dict[str, Any]]] = []
        self.created: list[dict[str, Any]] = []  # Job bodies POSTed, in order
        self.deleted: list[str] = []  # Job names DELETEd
        self.on_create: Any = None  # called with each created Job's body: the scenario plays out from it
        self.requests: list[str] = []
        self.lock = threading.Lock()
        self._serializer = client.ApiClient()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    # -- what the cluster holds -------------------------------------------------------------------
    def add(self, kind: str, event_type: str, model: Any, after_s: float = 0.0) -> None:
        """Record an object (a client model) as ADDED, MODIFIED or DELETED, visible after_s from now."""
        obj = json.loads(json.dumps(self._serializer.sanitize_for_serialization(model)))
        with self.lock:
            history = self.history[kind]
            obj.setdefault("metadata", {})["resourceVersion"] = str(len(history) + 1)
            obj["metadata"].setdefault("namespace", self.namespace)
            history.append((time.monotonic() + after_s, event_type, obj))

    def _visible(self, kind: str) -> list[tuple[str, dict[str, Any]]]:
        """The history up to now (an event is visible only once all before it are)."""
        now, out = time.monotonic(), []
        with self.lock:
            for at, event_type, obj in self.history[kind]:
                if at > now:
                    break
                out.append((event_type, obj))
        return out

    def current(self, kind: str) -> list[dict[str, Any]]:
        objects: dict[str, dict[str, Any]] = {}
        for event_type, obj in self._visible(kind):
            if event_type == "DELETED":
                objects.pop(obj["metadata"]["name"], None)
            else:
                objects[obj["metadata"]["name"]] = obj
        return list(objects.values())

    # -- server ---------------------------------------------------------------------------------
    @property
    def host(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def api_client(self) -> client.ApiClient:
        configuration = client.Configuration(host=self.host)
        return client.ApiClient(configuration)

    def __enter__(self) -> FakeKubeApi:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


def matches(obj: dict[str, Any], query: dict[str, list[str]]) -> bool:
    labels = obj["metadata"].get("labels") or {}
    for term in filter(None, query.get("labelSelector", [""])[0].split(",")):
        key, value = term.split("=", 1)
        if labels.get(key) != value:
            return False
    for term in filter(None, query.get("fieldSelector", [""])[0].split(",")):
        key, value = term.split("=", 1)
        assert key == "metadata.name", f"unsupported field selector {key}"
        if obj["metadata"]["name"] != value:
            return False
    return True


def _handler(api: FakeKubeApi) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"  # the body ends when the connection closes: streams need no chunking

        def log_message(self, *args: object) -> None:  # quiet
            pass

        def _send(self, status: int, body: bytes, content_type: str = "application/json") -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.end_headers()
            self.wfile.write(body)

        def _parts(self) -> tuple[list[str], dict[str, list[str]]]:
            url = urlparse(self.path)
            api.requests.append(f"{self.command} {url.path}")
            return [p for p in url.path.split("/") if p], parse_qs(url.query)

        def do_GET(self) -> None:
            parts, query = self._parts()
            # /api/v1/namespaces/NS/pods/NAME/log
            if parts[-1] == "log":
                name, container = parts[-2], query.get("container", [""])[0]
                text = api.logs.get((name, container))
                if text is None:
                    self._send(
                        404, json.dumps({"kind": "Status", "code": 404, "reason": "NotFound"}).encode()
                    )
                else:
                    self._send(200, text.encode(), "text/plain")
                return
            kind, list_kind = _PATHS[parts[-1]]
            if query.get("watch", ["false"])[0].lower() == "true":
                self._watch(kind, query)
                return
            items = [o for o in api.current(kind) if matches(o, query)]
            body = {
                "kind": list_kind,
                "apiVersion": "v1",
                "metadata": {"resourceVersion": "0"},
                "items": items,
            }
            self._send(200, json.dumps(body).encode())

        def _watch(self, kind: str, query: dict[str, list[str]]) -> None:
            since = int(query.get("resourceVersion", ["0"])[0] or 0)
            events = api._visible(kind)[since:]
            lines = [json.dumps({"type": t, "object": o}) for t, o in events if matches(o, query)]
            if not lines:
                time.sleep(0.05)  # nothing new: an idle watch window, shortened
            self._send(200, "".join(line + "\n" for line in lines).encode())

        def do_PATCH(self) -> None:
            parts, _ = self._parts()
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            name = parts[-1]
            api.patches.append((name, body))
            (job,) = [j for j in api.current("job") if j["metadata"]["name"] == name]
            patched = json.loads(json.dumps(job))
            patched["spec"] = {**(patched.get("spec") or {}), **body.get("spec", {})}
            model = api._serializer.deserialize(json.dumps(patched), "V1Job", "application/json")
            api.add("job", "MODIFIED", model)
            (result,) = [j for j in api.current("job") if j["metadata"]["name"] == name]
            self._send(200, json.dumps(result).encode())

        def do_POST(self) -> None:
            parts, _ = self._parts()
            assert parts[-1] == "jobs", f"unsupported create of {parts[-1]}"
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            api.created.append(body)
            api.add(
                "job", "ADDED", api._serializer.deserialize(json.dumps(body), "V1Job", "application/json")
            )
            if api.on_create is not None:
                api.on_create(body)
            self._send(201, json.dumps(body).encode())

        def do_DELETE(self) -> None:
            parts, _ = self._parts()
            name = parts[-1]
            api.deleted.append(name)
            for job in [j for j in api.current("job") if j["metadata"]["name"] == name]:
                model = api._serializer.deserialize(json.dumps(job), "V1Job", "application/json")
                api.add("job", "DELETED", model)
            self._send(200, json.dumps({"kind": "Status", "status": "Success"}).encode())

    return Handler
