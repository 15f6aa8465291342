"""Pairing coverage per route in /metrics: 3 of 4 spans and 3 of 4 entries paired."""

from __future__ import annotations

import re
import time
from pathlib import Path

import httpx
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from parallax_contracts.trace_context import new_span_id, new_trace_id
from tests.collector.helpers import beacon, entry, post_beacon, start_collector, wait_for


def test_pairing_coverage_metric(tmp_path: Path) -> None:
    c = start_collector(tmp_path / "data", "--coverage-interval", "1")
    try:
        c.wait_ready()
        # A minute old: inside the coverage window, which ends 30 s ago.
        origin_ms = time.time() * 1000 - 60_000
        traces = [(new_trace_id(), new_span_id()) for _ in range(5)]
        req = ExportTraceServiceRequest()
        ss = req.resource_spans.add().scope_spans.add()
        for tid, parent in traces[:4]:  # the 5th trace has no server span
            sp = ss.spans.add()
            sp.trace_id, sp.span_id = bytes.fromhex(tid), bytes.fromhex(new_span_id())
            sp.parent_span_id = bytes.fromhex(parent)
            sp.kind = Span.SpanKind.SPAN_KIND_SERVER
            sp.name = "GET /api/chat"
            kv = sp.attributes.add()
            kv.key, kv.value.string_value = "url.path", "/api/chat"
            sp.start_time_unix_nano = int((origin_ms + 105) * 1e6)
            sp.end_time_unix_nano = sp.start_time_unix_nano + 20_000_000
        r = httpx.post(
            f"{c.ingest}/v1/traces",
            content=req.SerializeToString(),
            timeout=10,
            headers={"content-type": "application/x-protobuf"},
        )
        assert r.status_code == 200
        # Entries for traces 0-2 and 4: trace 3's span has no browser entry.
        doc = beacon(
            [entry(t, p) for i, (t, p) in enumerate(traces) if i != 3], time_origin=origin_ms
        )
        assert post_beacon(c.ingest, doc).json()["accepted"] == 4

        def coverage() -> dict[str, float] | None:
            text = httpx.get(f"{c.query}/metrics", timeout=5).text
            got = {
                m.group(1): float(m.group(2))
                for m in re.finditer(
                    r'parallax_collector_pairing_coverage\{route="/api/chat",side="(\w+)"\} '
                    r"([0-9.]+)",
                    text,
                )
            }
            return got if got == {"spans": 0.75, "entries": 0.75} else None

        wait_for(coverage, timeout_s=30)
    finally:
        c.stop()
