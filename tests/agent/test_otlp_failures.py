"""OTLP spans the collector refuses are counted in /metrics
(parallax_agent_otlp_failed_spans_total), not only logged by the SDK: a receiver on loopback
that answers 400 (not retried by the exporter) to every export."""

from __future__ import annotations

from pathlib import Path

import pytest

from parallax_contracts import trace_context
from tests.agent.helpers import PY, Agent, OtlpReceiver, Proc, http_request

pytestmark = pytest.mark.ebpf


def test_refused_spans_are_counted(tmp_path: Path) -> None:
    rx = OtlpReceiver(status=400)
    srv = Proc([PY, "-m", "tests.agent.servers.py_server", "--timing-log", str(tmp_path / "t")])
    port = srv.port()
    try:
        agent = Agent(tmp_path, [port], ["--otlp", rx.url])
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
            assert rx.traces()
        finally:
            assert agent.stop() == 0
    finally:
        srv.stop()
        rx.close()
