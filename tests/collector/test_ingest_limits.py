"""Bad input gets a clear answer and loses nothing else (real collector, real HTTP)."""

from __future__ import annotations

import gzip
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceResponse,
)

from parallax_contracts.trace_context import new_span_id, new_trace_id
from tests.collector.helpers import Running, beacon, entry, post_beacon, start_collector, wait_for

SITE_ORIGIN = "https://shop.example"


@pytest.fixture(scope="module")
def strict(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Running]:
    """Sites configured, tokens required."""
    base: Path = tmp_path_factory.mktemp("strict")
    c = start_collector(
        base / "data",
        "--site",
        f"shop={SITE_ORIGIN}",
        "--otlp-token",
        "s3cret",
        "--api-token",
        "api-tok",
    )
    try:
        c.wait_ready()
        yield c
    finally:
        c.stop()


def otlp_json(spans: list[dict[str, object]]) -> dict[str, object]:
    return {
        "resourceSpans": [
            {
                "resource": {
                    "attributes": [{"key": "service.name", "value": {"stringValue": "j"}}]
                },
                "scopeSpans": [{"spans": spans}],
            }
        ]
    }


def json_span(start_ns: int, dur_ns: int, trace_id: str | None = None) -> dict[str, object]:
    return {
        "traceId": trace_id or new_trace_id(),
        "spanId": new_span_id(),
        "parentSpanId": new_span_id(),
        "name": "GET /j",
        "kind": 2,
        "startTimeUnixNano": str(start_ns),
        "endTimeUnixNano": str(start_ns + dur_ns),
        "attributes": [{"key": "url.path", "value": {"stringValue": "/items/12345"}}],
    }


def post_json_spans(base: str, doc: object, **headers: str) -> httpx.Response:
    return httpx.post(
        f"{base}/v1/traces",
        content=json.dumps(doc),
        timeout=10,
        headers={"content-type": "application/json", **headers},
    )


def test_otlp_json_partial_success(collector: Running) -> None:
    now = time.time_ns()
    good = [json_span(now - 10**9, 5 * 10**6) for _ in range(3)]
    bad = [
        json_span(now - 10**9, 5 * 10**6, trace_id="0" * 32),  # invalid trace id
        json_span(now - 10**9, -(10**6)),  # end before start
        json_span(now - 10**9, 25 * 3600 * 10**9),  # over 24 h
        json_span(now - 8 * 86_400 * 10**9, 10**6),  # older than the 7-day retention
    ]
    r = post_json_spans(collector.ingest, otlp_json(good + bad))
    assert r.status_code == 200
    ps = r.json()["partialSuccess"]
    assert int(ps["rejectedSpans"]) == 4
    for reason in (
        "invalid_trace_id",
        "negative_duration",
        "duration_over_24h",
        "older_than_retention",
    ):
        assert reason in ps["errorMessage"]
    tid = good[0]["traceId"]

    def stored() -> bool:
        d = httpx.get(f"{collector.query}/v1/requests/{tid}", timeout=5)
        return d.status_code == 200 and d.json()["unpaired_spans"][0]["route"] == "/items/{id}"

    wait_for(stored)
    m = httpx.get(f"{collector.query}/metrics", timeout=5).text
    assert 'parallax_collector_rows_rejected_total{reason="duration_over_24h",source="spans"}' in m


def test_otlp_protobuf_gzip_ok_and_malformed_400(collector: Running) -> None:
    r = httpx.post(
        f"{collector.ingest}/v1/traces",
        content=b"\xff\xff\xff",
        timeout=5,
        headers={"content-type": "application/x-protobuf"},
    )
    assert r.status_code == 400
    r = httpx.post(
        f"{collector.ingest}/v1/traces",
        content=gzip.compress(b""),
        timeout=5,
        headers={"content-type": "application/x-protobuf", "content-encoding": "gzip"},
    )
    assert r.status_code == 200
    assert ExportTraceServiceResponse.FromString(r.content).partial_success.rejected_spans == 0
    r = post_json_spans(collector.ingest, [1, 2])
    assert r.status_code == 400 and "\n" not in r.json()["message"]
    r = httpx.post(
        f"{collector.ingest}/v1/traces",
        content=b"x",
        timeout=5,
        headers={"content-type": "text/csv"},
    )
    assert r.status_code == 415


def test_body_limits_413(collector: Running) -> None:
    r = httpx.post(
        f"{collector.ingest}/v1/beacons",
        content=b"x" * (65 * 1024),
        timeout=5,
        headers={"content-type": "text/plain"},
    )
    assert r.status_code == 413
    r = httpx.post(
        f"{collector.ingest}/v1/traces",
        content=b"\0" * (1024 * 1024 + 1),
        timeout=5,
        headers={"content-type": "application/x-protobuf"},
    )
    assert r.status_code == 413
    # A gzip bomb: small on the wire, over the limit once inflated.
    bomb = gzip.compress(b"\0" * (2 * 1024 * 1024))
    r = httpx.post(
        f"{collector.ingest}/v1/traces",
        content=bomb,
        timeout=5,
        headers={"content-type": "application/x-protobuf", "content-encoding": "gzip"},
    )
    assert r.status_code == 413


def test_beacon_bad_version_and_bad_entries(collector: Running) -> None:
    r = post_beacon(collector.ingest, {"v": 9, "site": "s", "entries": []})
    assert r.status_code == 400 and r.text.count("\n") == 1 and "version" in r.text
    r = httpx.post(
        f"{collector.ingest}/v1/beacons",
        content=b"{not json",
        timeout=5,
        headers={"content-type": "text/plain"},
    )
    assert r.status_code == 400
    doc = beacon(
        [
            entry(),
            entry(trace_id="0" * 32),
            entry(response_start_ms=50.0),  # before request start: negative TTFB
            entry(response_end_ms=101.0 + 25 * 3600 * 1000),
            entry(kind="carrier-pigeon"),
        ]
    )
    r = post_beacon(collector.ingest, doc, origin="https://anything.example")
    assert r.status_code == 200
    assert r.json() == {
        "accepted": 1,
        "rejected": 4,
        "reasons": {
            "invalid_trace_id": 1,
            "negative_duration": 1,
            "duration_over_24h": 1,
            "schema": 1,
        },
    }
    # No site configured: any origin is accepted and echoed for CORS.
    assert r.headers["access-control-allow-origin"] == "https://anything.example"
    old = beacon([entry()], time_origin=(time.time() - 8 * 86_400) * 1000)
    assert post_beacon(collector.ingest, old).json()["reasons"] == {"older_than_retention": 1}


def test_sites_cors_and_403(strict: Running) -> None:
    ok = beacon([entry()], site="shop")
    r = post_beacon(strict.ingest, ok, origin=SITE_ORIGIN)
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == SITE_ORIGIN
    assert post_beacon(strict.ingest, ok, origin="https://evil.example").status_code == 403
    assert (
        post_beacon(strict.ingest, beacon([entry()], site="other"), origin=SITE_ORIGIN).status_code
        == 403
    )
    pre = httpx.options(
        f"{strict.ingest}/v1/beacons",
        timeout=5,
        headers={"origin": SITE_ORIGIN, "access-control-request-method": "POST"},
    )
    assert pre.status_code == 204 and pre.headers["access-control-allow-origin"] == SITE_ORIGIN
    pre = httpx.options(
        f"{strict.ingest}/v1/beacons",
        timeout=5,
        headers={"origin": "https://evil.example", "access-control-request-method": "POST"},
    )
    assert pre.status_code == 403 and "access-control-allow-origin" not in pre.headers


def test_tokens(strict: Running) -> None:
    doc = otlp_json([json_span(time.time_ns() - 10**9, 10**6)])
    assert post_json_spans(strict.ingest, doc).status_code == 401
    assert post_json_spans(strict.ingest, doc, authorization="Bearer nope").status_code == 401
    assert post_json_spans(strict.ingest, doc, authorization="Bearer s3cret").status_code == 200
    assert httpx.get(f"{strict.query}/v1/requests", timeout=5).status_code == 401
    assert httpx.get(f"{strict.query}/metrics", timeout=5).status_code == 401
    r = httpx.get(
        f"{strict.query}/v1/requests", timeout=5, headers={"authorization": "Bearer api-tok"}
    )
    assert r.status_code == 200 and r.json() == {"requests": []}
    # The public port serves nothing of the query API.
    assert httpx.get(f"{strict.ingest}/v1/requests", timeout=5).status_code == 404
    assert httpx.get(f"{strict.ingest}/openapi.json", timeout=5).status_code == 404
    assert httpx.get(f"{strict.ingest}/metrics", timeout=5).status_code == 404


def test_every_admin_route_needs_the_api_token(strict: Running) -> None:
    """The OpenAPI document is behind the token; the docs pages (which a browser cannot
    load with a token) are off. /readyz stays open for probes."""
    auth = {"authorization": "Bearer api-tok"}
    assert httpx.get(f"{strict.query}/openapi.json", timeout=5).status_code == 401
    r = httpx.get(f"{strict.query}/openapi.json", timeout=5, headers=auth)
    assert r.status_code == 200 and "/v1/requests" in r.json()["paths"]
    for page in ("/docs", "/redoc", "/docs/oauth2-redirect"):
        assert httpx.get(f"{strict.query}{page}", timeout=5, headers=auth).status_code == 404
    assert httpx.get(f"{strict.query}/readyz", timeout=5).status_code == 200


def test_without_a_token_the_docs_are_served(collector: Running) -> None:
    assert httpx.get(f"{collector.query}/openapi.json", timeout=5).status_code == 200
    assert httpx.get(f"{collector.query}/docs", timeout=5).status_code == 200


def test_rate_limit_429_with_retry_after(tmp_path: Path) -> None:
    # 1 request/s with a burst of 10: 30 requests cannot all pass unless each one took
    # over 0.6 s, so the test does not depend on this machine's speed.
    c = start_collector(tmp_path / "data", "--rate", "1", "--burst", "10")
    try:
        c.wait_ready()
        codes = []
        retry = None
        body = json.dumps(beacon([entry()]))
        with httpx.Client(timeout=5) as cl:
            for _ in range(30):
                r = cl.post(
                    f"{c.ingest}/v1/beacons", content=body, headers={"content-type": "text/plain"}
                )
                codes.append(r.status_code)
                if r.status_code == 429:
                    retry = r.headers.get("retry-after")
        assert codes[:10] == [200] * 10  # the burst
        assert 429 in codes and retry is not None and int(retry) >= 1
        m = httpx.get(f"{c.query}/metrics", timeout=5).text
        assert 'parallax_collector_requests_refused_total{code="429",endpoint="beacons"}' in m
    finally:
        c.stop()


def test_values_a_column_cannot_hold_are_rejected_at_the_edge() -> None:
    """A span whose count overflows its UInt32 column, or a beacon with NaN, must be turned
    away where it enters: written, it would fail its batch's insert for ever."""
    from collector.ingest import beacons
    from collector.ingest.common import BadRequestError

    with pytest.raises(BadRequestError, match="NaN"):
        beacons.load(b'{"v": 1, "site": "s", "session": "abcdefgh", "time_origin": NaN}')
    parsed = _otlp_with_attrs({"parallax.chunks": 5_000_000_000})
    assert parsed.rejected["out_of_range"] == 1 and not parsed.rows
    parsed = _otlp_with_attrs({"parallax.ttfb_us": 1e20})  # a double beyond Int64
    assert parsed.rejected["out_of_range"] == 1
    parsed = _otlp_with_attrs({"parallax.chunks": 12})
    assert len(parsed.rows) == 1


def _otlp_with_attrs(attrs: dict[str, float]) -> Any:
    from collector.ingest import otlp

    now = time.time_ns()
    span = json_span(now - 2_000_000_000, 50_000_000)
    span["attributes"] = [
        {"key": k, "value": {"intValue": str(v)} if isinstance(v, int) else {"doubleValue": v}}
        for k, v in attrs.items()
    ]
    body = json.dumps(otlp_json([span])).encode()
    return otlp.parse(body, True, now, now - 86_400 * 10**9, now)


def _otlp_body(service: str = "edge", name: str = "GET /e") -> tuple[bytes, str]:
    """A one-span OTLP/protobuf request and its trace id."""
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )
    from opentelemetry.proto.trace.v1.trace_pb2 import Span

    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    kv = rs.resource.attributes.add()
    kv.key, kv.value.string_value = "service.name", service
    sp = rs.scope_spans.add().spans.add()
    tid = new_trace_id()
    sp.trace_id, sp.span_id = bytes.fromhex(tid), bytes.fromhex(new_span_id())
    sp.kind, sp.name = Span.SpanKind.SPAN_KIND_SERVER, name
    sp.start_time_unix_nano = time.time_ns() - 10**9
    sp.end_time_unix_nano = sp.start_time_unix_nano + 10**6
    return req.SerializeToString(), tid


def _stored(c: Running, tid: str) -> bool:
    r = httpx.get(f"{c.query}/v1/requests/{tid}", timeout=5)
    return r.status_code == 200 and len(r.json()["unpaired_spans"]) == 1


def test_multi_member_gzip_is_read_whole(collector: Running) -> None:
    """``cat a.gz b.gz`` is one valid gzip body (RFC 1952): both members' spans are stored
    (it was truncated to the first: acknowledged, never stored). A truncated member, or
    bytes after the last one, is a 400."""
    (a, tid_a), (b, tid_b) = _otlp_body(), _otlp_body()
    headers = {"content-type": "application/x-protobuf", "content-encoding": "gzip"}
    r = httpx.post(f"{collector.ingest}/v1/traces", content=gzip.compress(a) + gzip.compress(b),
                   headers=headers, timeout=5)  # fmt: skip
    assert r.status_code == 200
    wait_for(lambda: _stored(collector, tid_a) and _stored(collector, tid_b))
    for body in (gzip.compress(a)[:-5], gzip.compress(a) + b"trailing", b""):
        r = httpx.post(f"{collector.ingest}/v1/traces", content=body, headers=headers, timeout=5)
        assert r.status_code == 400, body[-10:]
    # Members that inflate past the limit together are refused, as one would be.
    half = gzip.compress(b"\0" * (600 * 1024))
    r = httpx.post(f"{collector.ingest}/v1/traces", content=half + half, headers=headers,
                   timeout=5)  # fmt: skip
    assert r.status_code == 413


def test_deep_json_is_a_400_on_both_endpoints(collector: Running) -> None:
    for depth in (1000, 20_000):
        nested = b"[" * depth + b"]" * depth
        r = httpx.post(f"{collector.ingest}/v1/beacons", content=nested, timeout=5,
                       headers={"content-type": "text/plain"})  # fmt: skip
        assert r.status_code == 400, r.text
        body = b'{"resourceSpans": ' + nested + b"}"
        r = httpx.post(f"{collector.ingest}/v1/traces", content=body, timeout=5,
                       headers={"content-type": "application/json"})  # fmt: skip
        assert r.status_code == 400 and r.json()["code"] == 3, r.text


def test_strings_and_numbers_the_store_cannot_hold_are_refused(collector: Running) -> None:
    """A lone surrogate or a NUL in a beacon string, an infinite number: that entry is
    refused (counted, reason "schema") and the rest of the beacon kept; in the envelope,
    the beacon is a 400. A span storing a NUL is rejected (invalid_string)."""
    ok = entry()
    text = json.dumps(beacon([entry(url="http://x.test/\ud800"), entry(error="a\u0000"), ok]))
    r = httpx.post(f"{collector.ingest}/v1/beacons", content=text, timeout=5,
                   headers={"content-type": "text/plain"})  # fmt: skip
    assert r.status_code == 200 and r.json()["reasons"] == {"schema": 2}, r.text
    inf = json.dumps(beacon([ok])).replace('"entries"', '"sent_ms": 1e400, "entries"')
    r = httpx.post(f"{collector.ingest}/v1/beacons", content=inf, timeout=5,
                   headers={"content-type": "text/plain"})  # fmt: skip
    assert r.status_code == 400 and "sent_ms" in r.text
    body, _ = _otlp_body(name="GET /\x00")
    r = httpx.post(f"{collector.ingest}/v1/traces", content=body, timeout=5,
                   headers={"content-type": "application/x-protobuf"})  # fmt: skip
    ps = ExportTraceServiceResponse.FromString(r.content).partial_success
    assert r.status_code == 200 and ps.rejected_spans == 1 and "invalid_string" in ps.error_message
