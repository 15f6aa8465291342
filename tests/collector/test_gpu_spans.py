"""SERVER spans with the agent's parallax.gpu.* attributes, from the real OpenTelemetry SDK
exporter into a real collector: stored in their columns and shown per request by the query
API; a span without them shows no GPU object (absent, not zeros)."""

from __future__ import annotations

from typing import Any

import httpx
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind

from tests.collector.gpu_sdk import GPU_A, GPU_B
from tests.collector.helpers import Running, wait_for

GPU_ATTRS: dict[str, Any] = {
    "parallax.gpu.prefill_launches": 40,
    "parallax.gpu.decode_launches": 1200,
    "parallax.gpu.prefill_wait_us": 100_000,
    "parallax.gpu.decode_wait_us": 2_500,
    "parallax.gpu.prefill_sm_util_pct": 97.5,
    "parallax.gpu.decode_sm_util_pct": 61.25,
    "parallax.gpu.sample_coverage": 0.875,
    "parallax.gpu.inflight_mean": 14.0,
    "parallax.gpu.uuid": f"{GPU_A},{GPU_B}",
}


def test_sdk_gpu_span_per_request(collector: Running) -> None:
    tp = TracerProvider(resource=Resource.create({"service.name": "llm", "host.name": "n1"}))
    tp.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(f"{collector.ingest}/v1/traces")))
    tracer = tp.get_tracer("agent-like")
    ids = []
    for attrs in (GPU_ATTRS, {}):
        base: dict[str, Any] = {
            "url.path": "/v1/chat",
            "http.request.method": "POST",
            "parallax.ttft_us": 840_000,
        }
        with tracer.start_as_current_span(
            "POST /v1/chat", kind=SpanKind.SERVER, attributes={**base, **attrs}
        ) as sp:
            ids.append(format(sp.get_span_context().trace_id, "032x"))
    tp.shutdown()

    def hop(tid: str) -> dict[str, Any] | None:
        r = httpx.get(f"{collector.query}/v1/requests/{tid}", timeout=5)
        spans = r.json()["unpaired_spans"] if r.status_code == 200 else []
        return spans[0] if spans else None

    with_gpu = wait_for(lambda: hop(ids[0]))
    assert with_gpu["gpu"] == {
        "prefill_launches": 40,
        "decode_launches": 1200,
        "prefill_wait_ms": 100.0,
        "decode_wait_ms": 2.5,
        "prefill_sm_util_pct": 97.5,
        "decode_sm_util_pct": 61.25,
        "sample_coverage": 0.875,
        "inflight_mean": 14.0,
        "uuids": [GPU_A, GPU_B],
    }
    assert with_gpu["ttft_ms"] == 840.0
    without = wait_for(lambda: hop(ids[1]))
    assert without["gpu"] is None
