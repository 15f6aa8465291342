"""A loopback HTTP server for the probe's browser tests: it serves test pages (with chosen
response headers), the built probe (parallax.min.js, and its token reader
parallax-llm.min.js, at any path: the core imports the reader from its own directory) and
OpenTelemetry bundles, and records the beacons the
probe posts, each validated against the beacon v1 contract (parallax_contracts.beacon) —
decoded whole, as the collector's fast path takes a plain beacon."""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import msgspec

from parallax_contracts import beacon

ROOT = Path(__file__).resolve().parents[2]
PROBE_JS = ROOT / "js_probe" / "dist" / "parallax.min.js"
READER_JS = ROOT / "js_probe" / "dist" / "parallax-llm.min.js"  # the token reader
OTEL_JS = ROOT / "js_probe" / "build" / "otel.js"
LLM_JS = ROOT / "js_probe" / "build" / "llm.js"  # the openai and ai SDKs for the page


@dataclass
class Received:
    doc: dict[str, Any]
    errors: list[str]
    content_type: str


@dataclass
class Page:
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)
    ctype: str = "text/html; charset=utf-8"


class Sink:
    """Pages + beacon recorder on 127.0.0.1, port chosen by the kernel."""

    def __init__(self) -> None:
        self.beacons: list[Received] = []
        self.requests: list[tuple[str, str | None]] = []  # (path, traceparent header)
        self.pages: dict[str, Page] = {}
        self.missing: set[str] = set()  # paths answered 404 (e.g. the token reader)
        self.delay_s: dict[str, float] = {}  # paths answered this much later
        self.lock = threading.Lock()
        sink = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:  # quiet
                pass

            def _send(self, status: int, body: bytes, headers: dict[str, str]) -> None:
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Cache-Control", "no-store")
                self.end_headers()
                self.wfile.write(body)

            def do_OPTIONS(self) -> None:
                self._send(
                    204,
                    b"",
                    {
                        "Access-Control-Allow-Origin": self.headers.get("Origin", "*"),
                        "Access-Control-Allow-Headers": "traceparent, content-type",
                        "Access-Control-Allow-Methods": "GET, POST",
                        "Access-Control-Max-Age": "86400",
                    },
                )

            def do_POST(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(n)
                if self.path.split("?")[0] == "/v1/beacons":
                    try:
                        doc = json.loads(raw)
                        errs = []
                        try:
                            beacon.decode(raw)
                        except msgspec.DecodeError as e:
                            # Invalid (the messages say where), or valid only for the
                            # collector's slower entry-by-entry path.
                            errs = beacon.errors(doc) or [f"not decoded whole: {e}"]
                    except ValueError as e:
                        doc, errs = {}, [f"not JSON: {e}"]
                    with sink.lock:
                        sink.beacons.append(
                            Received(doc, errs, self.headers.get("Content-Type", ""))
                        )
                    self._send(204, b"", {"Access-Control-Allow-Origin": "*"})
                else:
                    self.do_GET()

            def do_GET(self) -> None:
                path = self.path.split("?")[0]
                with sink.lock:
                    sink.requests.append((self.path, self.headers.get("traceparent")))
                name = path.rsplit("/", 1)[-1]
                time.sleep(sink.delay_s.get(path, 0))  # (one thread per request)
                if path in sink.missing:
                    self._send(404, b"not found", {"Content-Type": "text/plain"})
                elif name in (PROBE_JS.name, READER_JS.name):
                    js = (PROBE_JS if name == PROBE_JS.name else READER_JS).read_bytes()
                    self._send(200, js, {"Content-Type": "text/javascript"})
                elif path == "/otel.js":
                    self._send(200, OTEL_JS.read_bytes(), {"Content-Type": "text/javascript"})
                elif path == "/llm.js":
                    self._send(200, LLM_JS.read_bytes(), {"Content-Type": "text/javascript"})
                elif path == "/notao":
                    # CORS, but no Timing-Allow-Origin: Resource Timing hides the phases.
                    origin = self.headers.get("Origin", "*")
                    self._send(200, b"ok", {"Access-Control-Allow-Origin": origin})
                elif path in sink.pages:
                    p = sink.pages[path]
                    self._send(200, p.body, {"Content-Type": p.ctype, **p.headers})
                else:
                    self._send(404, b"not found", {"Content-Type": "text/plain"})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port: int = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def entries(self) -> list[dict[str, Any]]:
        with self.lock:
            return [e for b in self.beacons for e in b.doc.get("entries", [])]

    def wait_entry(self, pred: Any, timeout_s: float = 10.0) -> dict[str, Any]:
        """The first beacon entry matching ``pred``; fails the test after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for e in self.entries():
                if pred(e):
                    return e
            time.sleep(0.05)
        raise AssertionError(f"no matching beacon entry within {timeout_s}s; got {self.entries()}")

    def wait_entry_list(self, pred: Any, n: int, timeout_s: float = 10.0) -> list[dict[str, Any]]:
        """At least ``n`` beacon entries matching ``pred`` (all of them)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            got = [e for e in self.entries() if pred(e)]
            if len(got) >= n:
                return got
            time.sleep(0.05)
        raise AssertionError(
            f"fewer than {n} matching entries within {timeout_s}s: {self.entries()}"
        )

    def invalid(self) -> list[str]:
        with self.lock:
            return [err for b in self.beacons for err in b.errors]
