"""OTLP spans the collector refuses are counted in /metrics
(parallax_agent_otlp_failed_spans_total), not only logged by the SDK: a receiver on loopback
that answers 400 (not retried by the exporter) to every export."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from parallax_contracts import trace_context
from tests.agent.helpers import PY, Agent, Proc, http_request

pytestmark = pytest.mark.ebpf


class _Refusing(BaseHTTPRequestHandler):
    posts = 0

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        type(self).posts += 1
        self.send_response(400)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: Any) -> None:
        pass


def test_refused_spans_are_counted(tmp_path: Path) -> None:
    rx = ThreadingHTTPServer(("127.0.0.1", 0), _Refusing)
    threading.Thread(target=rx.serve_forever, daemon=True).start()
    srv = Proc([PY, "-m", "tests.agent.servers.py_server", "--timing-log", str(tmp_path / "t")])
    port = srv.port()
    try:
        url = f"http://127.0.0.1:{rx.server_address[1]}"
        agent = Agent(tmp_path, [port], ["--otlp", url])
        try:
            assert agent.metrics()["parallax_agent_otlp_failed_spans_total"] == 0
            for i in range(3):
                ctx = trace_context.generate()
                head = f"GET /refused-{i} HTTP/1.1\r\ntraceparent: {ctx.header()}\r\n\r\n"
                assert http_request(port, head.encode()).startswith(b"HTTP/1.1 200")
            n = agent.wait_metric(
                "parallax_agent_otlp_failed_spans_total", lambda v: v >= 3, timeout=15
            )
            assert n == 3, n
            assert _Refusing.posts >= 1
        finally:
            assert agent.stop() == 0
    finally:
        srv.stop()
        rx.shutdown()
