"""A stand-in for the Kubernetes API on 127.0.0.1 (plain HTTP/1.1): it answers the pod list
and watch requests of ``GET /api/v1/pods`` from a script and records every request, so the
real ``kubernetes`` client (agent.identity.k8s) talks to it as to an API server.

The answers are written in the API's own shapes (tests/agent/k8s_api/, as ``kubectl get
pods -o json`` and the API server's errors show them; there is no cluster here to record
from): a ``PodList``, ``Status`` objects for errors (403 Forbidden with RBAC's message, 410
Expired with "too old resource version"), and a watch as a chunked stream of one JSON event
per line, which the server keeps open (as the API server does until the watch's timeout)
or ends, or cuts without its last chunk (a dropped connection).
"""

from __future__ import annotations

import copy
import json
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

FIXTURES = Path(__file__).with_name("k8s_api")


def fixture(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


def pod_list() -> dict[str, Any]:
    """node-a's pods (a Deployment's with a sidecar, a StatefulSet's, a DaemonSet's, a
    Job's and a static pod's mirror), as the API lists them."""
    return copy.deepcopy(fixture("pods.json"))


@dataclass
class Json:
    """A whole answer: ``body`` as JSON with this status."""

    body: Any
    status: int = 200
    delay_s: float = 0.0  # before answering (a slow API server)
    gate: threading.Event | None = None  # ... or until the test sets this (at most 30 s)


@dataclass
class Stream:
    """A watch: these events, then held open until the server closes (``hold``), ended
    with the last chunk, or cut off without it (``cut``)."""

    events: list[dict[str, Any]] = field(default_factory=list)
    hold: bool = False
    cut: bool = False
    gap_s: float = 0.0  # between events


class ApiReplay:
    """Scripted answers per request kind (``lists``, ``watches``), taken in order; with
    none left, a list is answered as the last one was and a watch is held open."""

    def __init__(self) -> None:
        self.lists: deque[Json] = deque()
        self.watches: deque[Json | Stream] = deque()
        self.requests: list[dict[str, str]] = []  # query parameters, "kind": list|watch
        self._last_list: Json = Json({"kind": "PodList", "apiVersion": "v1", "items": []})
        self._closing = threading.Event()
        self._seen = threading.Condition()
        replay = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                url = urlsplit(self.path)
                q = dict(parse_qsl(url.query))
                kind = "watch" if q.get("watch") == "true" else "list"
                with replay._seen:
                    replay.requests.append({"kind": kind, "path": url.path, **q})
                    replay._seen.notify_all()
                if url.path != "/api/v1/pods":
                    self._json(Json({"kind": "Status", "code": 404}, 404))
                elif kind == "list":
                    if replay.lists:
                        replay._last_list = replay.lists.popleft()
                    self._json(replay._last_list)
                else:
                    answer = replay.watches.popleft() if replay.watches else Stream(hold=True)
                    if isinstance(answer, Json):
                        self._json(answer)
                    else:
                        self._stream(answer)

            def _json(self, a: Json) -> None:
                time.sleep(a.delay_s)
                if a.gate is not None:
                    a.gate.wait(30)
                body = json.dumps(a.body).encode()
                self.send_response(a.status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _stream(self, s: Stream) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                for ev in s.events:
                    if s.gap_s:
                        time.sleep(s.gap_s)
                    line = json.dumps(ev).encode() + b"\n"
                    self.wfile.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
                    self.wfile.flush()
                if s.cut:
                    self.close_connection = True
                    return
                if s.hold:
                    replay._closing.wait()
                self.wfile.write(b"0\r\n\r\n")
                self.close_connection = True

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._srv.daemon_threads = True
        threading.Thread(target=self._srv.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self._srv.server_address[1]}"

    def of(self, kind: str) -> list[dict[str, str]]:
        return [r for r in self.requests if r["kind"] == kind]

    def wait_requests(self, kind: str, n: int, timeout: float = 10.0) -> list[dict[str, str]]:
        """Until ``n`` requests of this kind came (fails after ``timeout``)."""
        deadline = time.monotonic() + timeout
        with self._seen:
            while len(self.of(kind)) < n:
                left = deadline - time.monotonic()
                assert left > 0, f"{len(self.of(kind))} {kind} requests of {n}: {self.requests}"
                self._seen.wait(left)
        return self.of(kind)

    def close(self) -> None:
        self._closing.set()
        self._srv.shutdown()
        self._srv.server_close()


def event(kind: str, obj: dict[str, Any]) -> dict[str, Any]:
    return {"type": kind, "object": obj}


def bookmark(rv: str) -> dict[str, Any]:
    meta = {"resourceVersion": rv}
    return event("BOOKMARK", {"kind": "Pod", "apiVersion": "v1", "metadata": meta})
