"""The OTLP/HTTP export: a real OpenTelemetry SDK exporter posting protobuf to a receiver on
loopback; the spans must be SERVER children of the browser's span, at kernel times, with the
contract's attribute names."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from parallax_contracts import span_attributes as sa
from parallax_contracts import trace_context
from tests.agent.helpers import PY, Agent, OtlpReceiver, Proc, http_request

pytestmark = pytest.mark.ebpf


@pytest.fixture(scope="module")
def setup(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[int, Agent, OtlpReceiver]]:
    tmp: Path = tmp_path_factory.mktemp("otlp")
    rx = OtlpReceiver()
    srv = Proc(
        [PY, "-m", "tests.agent.servers.py_server", "--timing-log", str(tmp / "t.jsonl")],
        env={"OTEL_SERVICE_NAME": "otlp-test-svc"},
    )
    port = srv.port()
    try:
        agent = Agent(tmp, [port], ["--otlp", rx.url])
    except Exception:
        srv.stop()
        rx.close()
        raise
    yield port, agent, rx
    assert agent.stop() == 0  # SIGTERM flushes the batch processor
    srv.stop()
    rx.close()


def test_span_is_a_server_child_with_contract_attributes(
    setup: tuple[int, Agent, OtlpReceiver],
) -> None:
    port, agent, rx = setup
    ctx = trace_context.generate()
    http_request(
        port,
        f"GET /otlp?n=50 HTTP/1.1\r\ntraceparent: {ctx.header()}\r\n"
        "Connection: close\r\n\r\n".encode(),
    )
    [rec] = agent.wait_for(lambda r: r["trace_id"] == ctx.trace_id)
    agent.stop()
    received = [ExportTraceServiceRequest.FromString(body) for body in rx.traces()]
    spans = [
        (rs, s)
        for req in received
        for rs in req.resource_spans
        for ss in rs.scope_spans
        for s in ss.spans
        if s.trace_id.hex() == ctx.trace_id
    ]
    assert len(spans) == 1
    rs, span = spans[0]
    assert span.kind == span.SPAN_KIND_SERVER
    assert span.parent_span_id.hex() == ctx.span_id
    assert span.start_time_unix_nano == rec["start_unix_ns"]
    assert span.end_time_unix_nano == rec["end_unix_ns"]
    # its sampling, stated the OpenTelemetry way: every request kept (th:0)
    assert span.trace_state == "ot=th:0" and rec["sample_th"] == "0"
    attrs = {a.key: a.value for a in span.attributes}
    assert set(attrs) <= set(sa.BY_NAME)
    assert attrs[sa.URL_PATH.name].string_value == "/otlp"
    assert attrs[sa.HTTP_RESPONSE_STATUS_CODE.name].int_value == 200
    assert attrs[sa.TTFB_US.name].int_value == rec["ttfb_us"]
    assert attrs[sa.SOURCE.name].string_value == "ebpf"
    res = {a.key: a.value.string_value for a in rs.resource.attributes}
    assert res[sa.RESOURCE_SERVICE_NAME] == "otlp-test-svc"
