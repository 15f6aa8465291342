"""Spans from the real OpenTelemetry SDK exporter + beacons over HTTP → pairs and parts.

Every expected value is computed by hand from the timings the test chose (a server clock
7 ms ahead of the browser's, 10 ms request path, 12 ms response path), never read back.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from parallax_contracts import span_attributes as sa
from parallax_contracts.trace_context import new_span_id, new_trace_id
from tests.collector.helpers import Running, beacon, entry, post_beacon, wait_for

MS = 1_000_000  # ns per ms


class Sender:
    """One TracerProvider per (service, host): what each traced process would run."""

    def __init__(self, endpoint: str):
        self.endpoint = endpoint
        self.providers: list[TracerProvider] = []

    def tracer(self, service: str, host: str = "node-a") -> Tracer:
        p = TracerProvider(resource=Resource.create({"service.name": service, "host.name": host}))
        p.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=self.endpoint)))
        self.providers.append(p)
        return p.get_tracer("parallax-test")

    def close(self) -> None:
        for p in self.providers:
            p.shutdown()


@pytest.fixture(scope="module")
def sender(collector: Running) -> Iterator[Sender]:
    s = Sender(f"{collector.ingest}/v1/traces")
    yield s
    s.close()


def server_span(
    tracer: Tracer,
    trace_id: str,
    parent: str,
    t1_ns: int,
    end_ns: int,
    attrs: dict[str, Any],
) -> str:
    ctx: Context = TraceContextTextMapPropagator().extract(
        {"traceparent": f"00-{trace_id}-{parent}-01"}
    )
    span = tracer.start_span(
        "GET /api/chat", context=ctx, kind=SpanKind.SERVER, start_time=t1_ns, attributes=attrs
    )
    span.end(end_time=end_ns)
    return format(span.get_span_context().span_id, "016x")


def agent_attrs(t_arr_ns: int, ttfb_ms: float, port: int, **more: Any) -> dict[str, Any]:
    a: dict[str, Any] = {
        sa.SOURCE.name: sa.SOURCE_EBPF,
        sa.HTTP_REQUEST_METHOD.name: "GET",
        sa.URL_PATH.name: "/api/chat",
        sa.HTTP_RESPONSE_STATUS_CODE.name: 200,
        sa.SERVER_PORT.name: port,
        sa.ARRIVAL_UNIX_NS.name: t_arr_ns,
        sa.TTFB_US.name: round(ttfb_ms * 1000),
    }
    a.update(more)
    return a


def get_detail(c: Running, trace_id: str, want_hops: int = 1) -> dict[str, Any]:
    def ok() -> dict[str, Any] | None:
        r = httpx.get(f"{c.query}/v1/requests/{trace_id}", timeout=10)
        if r.status_code != 200:
            return None
        d: dict[str, Any] = r.json()
        ex = d["exchanges"]
        return d if ex and len(ex[0]["hops"]) >= want_hops else None

    result: dict[str, Any] = wait_for(ok)
    return result


def listed(c: Running, trace_id: str) -> dict[str, Any]:
    def ok() -> dict[str, Any] | None:
        r = httpx.get(
            f"{c.query}/v1/requests", params={"route": "/api/chat", "limit": 1000}, timeout=10
        )
        r.raise_for_status()
        rows = [x for x in r.json()["requests"] if x["trace_id"] == trace_id]
        return rows[0] if rows else None

    result: dict[str, Any] = wait_for(ok)
    return result


def test_one_hop_parts_by_hand(collector: Running, sender: Sender) -> None:
    tid, bspan = new_trace_id(), new_span_id()
    origin_ms = float(int(time.time() * 1000) - 10_000) + 0.25
    # Browser clock: t0 = 101, t3 = 150 after time_origin.
    t0_abs = origin_ms + 101.0
    theta_true, up, down = 7.0, 10.0, 12.0
    t_arr_ms = t0_abs + up + theta_true  # server clock
    t1_ms = t_arr_ms + 3.0  # queue: accept part 1, receive part 2
    t2_ms = origin_ms + 150.0 + theta_true - down
    ttfb = t2_ms - t1_ms
    t_arr, t1 = round(t_arr_ms * MS), round(t1_ms * MS)
    attrs = agent_attrs(
        t_arr,
        ttfb,
        8000,
        **{
            sa.RECV_QUEUE_US.name: 2000,
            sa.TTFT_US.name: 30_000,
            sa.CHUNK_OFFSETS_US.name: [30_000, 40_000, 55_000],
            sa.DURATION_US.name: 80_000,
            sa.SRTT_US.name: 1500,
            sa.RETRANSMITS.name: 2,
        },
    )
    span_id = server_span(sender.tracer("app"), tid, bspan, t1, t1 + 80 * MS, attrs)
    doc = beacon(
        [
            entry(
                tid,
                bspan,
                first_chunk_ms=160.0,
                chunk_ms=[160.0, 170.0, 185.0],
                rendered_ms=175.0,
                response_end_ms=200.0,
            )
        ],
        time_origin=origin_ms,
    )
    r = post_beacon(collector.ingest, doc)
    assert r.status_code == 200 and r.json()["accepted"] == 1
    d = get_detail(collector, tid)
    (ex,) = d["exchanges"]
    assert [h["span_id"] for h in ex["hops"]] == [span_id]
    assert ex["hops"][0]["role"] == "edge+origin"
    p = ex["parts"]
    user_ttfb = 150.0 - 101.0
    expect = {
        "user_ttfb_ms": user_ttfb,
        "user_ttft_ms": 160.0 - 101.0,
        "user_visible_ttft_ms": 175.0 - 101.0,
        "user_duration_ms": 200.0 - 101.0,
        "render_delay_ms": 175.0 - 160.0,
        "server_ttfb_ms": ttfb,
        "server_ttft_ms": 30.0,
        "server_duration_ms": 80.0,
        "network_ms": user_ttfb - (t2_ms - t_arr_ms),  # = up + down
        "queue_ms": 3.0,
        "recv_queue_ms": 2.0,
        "accept_queue_ms": 1.0,
        "srtt_ms": 1.5,
        "theta_ms": ((t_arr_ms - t0_abs) + (t2_ms - (origin_ms + 150.0))) / 2,
    }
    for k, v in expect.items():
        assert p[k] == pytest.approx(v, abs=2e-3), k
    assert p["network_ms"] == pytest.approx(up + down, abs=2e-3)
    assert abs(p["theta_ms"] - theta_true) == pytest.approx(abs(up - down) / 2, abs=2e-3)
    assert p["theta_delay_ms"] == pytest.approx(p["network_ms"], abs=1e-9)
    assert p["user_itl_ms"] == pytest.approx([10.0, 15.0])
    assert p["server_itl_ms"] == pytest.approx([10.0, 15.0])
    assert p["retransmits"] == 2
    assert p["server_timed"] is True
    # The parts add up: user TTFB = δ + Σ hop time (origin: queue + server TTFB).
    assert p["hop_added_ms"] == pytest.approx([3.0 + ttfb], abs=2e-3)
    assert p["network_ms"] + sum(p["hop_added_ms"]) == pytest.approx(user_ttfb, abs=2e-3)
    # And the pairs table holds the same numbers (what the SLA checker reads).
    row = listed(collector, tid)
    assert row["hops"] == 1 and row["service"] == "app" and row["route"] == "/api/chat"
    for k in ("user_ttfb_ms", "server_ttfb_ms", "network_ms", "queue_ms", "theta_ms"):
        assert row[k] == pytest.approx(p[k], abs=1e-6), k


def test_two_hops_proxy_and_app(collector: Running, sender: Sender) -> None:
    """nginx forwards traceparent: two spans, one parent; edge = first by arrival."""
    tid, bspan = new_trace_id(), new_span_id()
    origin_ms = float(int(time.time() * 1000) - 8_000)
    base = round((origin_ms + 120.0) * MS)
    # Edge (proxy): arrives first, answers last. Origin: inside it in time.
    edge_arr, edge_t1 = base, base + 1 * MS
    app_arr, app_t1 = base + 3 * MS, base + 5 * MS
    app_ttfb, edge_ttfb = 20.0, 27.0  # edge t2 = app t2 + 3 ms
    # Send the origin first: order must come from arrival, not from sending order.
    app_id = server_span(
        sender.tracer("app"),
        tid,
        bspan,
        app_t1,
        app_t1 + 60 * MS,
        agent_attrs(
            app_arr, app_ttfb, 8000, **{sa.CHUNK_OFFSETS_US.name: [20_000, 30_000, 40_000]}
        ),
    )
    edge_id = server_span(
        sender.tracer("nginx"),
        tid,
        bspan,
        edge_t1,
        edge_t1 + 70 * MS,
        agent_attrs(
            edge_arr, edge_ttfb, 80, **{sa.CHUNK_OFFSETS_US.name: [27_000, 27_100, 47_000]}
        ),
    )
    post_beacon(
        collector.ingest,
        beacon(
            [entry(tid, bspan, request_start_ms=110.0, response_start_ms=160.0)],
            time_origin=origin_ms,
        ),
    ).raise_for_status()
    d = get_detail(collector, tid, want_hops=2)
    (ex,) = d["exchanges"]
    assert [h["span_id"] for h in ex["hops"]] == [edge_id, app_id]
    assert [h["role"] for h in ex["hops"]] == ["edge", "origin"]
    p = ex["parts"]
    assert p["server_ttfb_ms"] == pytest.approx(app_ttfb, abs=1e-3)
    edge_span = (edge_t1 - edge_arr) / MS + edge_ttfb  # t2 − t_arr at the edge
    app_span = (app_t1 - app_arr) / MS + app_ttfb
    assert p["network_ms"] == pytest.approx(50.0 - edge_span, abs=1e-3)
    assert p["hop_added_ms"] == pytest.approx([edge_span - app_span, app_span], abs=1e-3)
    assert p["edge_itl_ms"] == pytest.approx([0.1, 19.9], abs=1e-6)
    assert p["server_itl_ms"] == pytest.approx([10.0, 10.0], abs=1e-6)
    row = listed(collector, tid)
    assert row["hops"] == 2 and row["service"] == "app"


def test_sdk_and_agent_span_for_one_hop(collector: Running, sender: Sender) -> None:
    tid, bspan = new_trace_id(), new_span_id()
    origin_ms = float(int(time.time() * 1000) - 6_000)
    t1 = round((origin_ms + 105.0) * MS)
    agent_id = server_span(
        sender.tracer("app"), tid, bspan, t1, t1 + 40 * MS, agent_attrs(t1 - 1 * MS, 12.0, 8000)
    )
    # The app's own OpenTelemetry SDK: same host and port, starts a bit later, no timings.
    sdk_id = server_span(
        sender.tracer("app"),
        tid,
        bspan,
        t1 + 200_000,
        t1 + 39 * MS,
        {
            sa.HTTP_REQUEST_METHOD.name: "GET",
            sa.HTTP_ROUTE.name: "/api/chat",
            sa.SERVER_PORT.name: 8000,
        },
    )
    post_beacon(collector.ingest, beacon([entry(tid, bspan)], time_origin=origin_ms))
    d = get_detail(collector, tid)

    def linked() -> dict[str, Any] | None:
        dd = get_detail(collector, tid)
        return dd if dd["exchanges"][0]["linked_span_ids"] else None

    d = wait_for(linked)
    (ex,) = d["exchanges"]
    assert [h["span_id"] for h in ex["hops"]] == [agent_id]
    assert ex["linked_span_ids"] == [sdk_id]
    assert ex["parts"]["server_ttfb_ms"] == pytest.approx(12.0, abs=1e-3)
    assert d["unpaired_spans"] == []


def test_sdk_span_alone_pairs_with_its_duration(collector: Running, sender: Sender) -> None:
    tid, bspan = new_trace_id(), new_span_id()
    origin_ms = float(int(time.time() * 1000) - 6_000)
    t1 = round((origin_ms + 105.0) * MS)
    server_span(
        sender.tracer("plain-sdk-app"),
        tid,
        bspan,
        t1,
        t1 + 33 * MS,
        {sa.HTTP_REQUEST_METHOD.name: "GET", sa.HTTP_ROUTE.name: "/api/chat"},
    )
    post_beacon(collector.ingest, beacon([entry(tid, bspan)], time_origin=origin_ms))
    p = get_detail(collector, tid)["exchanges"][0]["parts"]
    assert p["server_ttfb_ms"] == pytest.approx(33.0, abs=1e-3)
    assert p["server_timed"] is False and p["queue_ms"] is None
    assert p["network_ms"] == pytest.approx(49.0 - 33.0, abs=1e-3)


def test_eventsource_reconnect_pairs_first(collector: Running, sender: Sender) -> None:
    tid, bspan = new_trace_id(), new_span_id()
    origin_ms = float(int(time.time() * 1000) - 20_000)
    tr = sender.tracer("sse-app")
    t1 = round((origin_ms + 105.0) * MS)
    first = server_span(tr, tid, bspan, t1, t1 + 2000 * MS, agent_attrs(t1 - MS, 5.0, 8000))
    # The browser reconnects with the same URL (same traceparent) after the stream broke.
    t1b = t1 + 5000 * MS
    server_span(tr, tid, bspan, t1b, t1b + 2000 * MS, agent_attrs(t1b - MS, 6.0, 8000))
    t1c = t1 + 9000 * MS
    server_span(tr, tid, bspan, t1c, t1c + 1000 * MS, agent_attrs(t1c - MS, 7.0, 8000))
    post_beacon(
        collector.ingest, beacon([entry(tid, bspan, kind="eventsource")], time_origin=origin_ms)
    )

    def three() -> dict[str, Any] | None:
        dd = get_detail(collector, tid)
        return dd if dd["exchanges"][0]["reconnects"] == 2 else None

    (ex,) = wait_for(three)["exchanges"]
    assert [h["span_id"] for h in ex["hops"]] == [first]
    assert ex["parts"]["server_ttfb_ms"] == pytest.approx(5.0, abs=1e-3)
    assert listed(collector, tid)["reconnects"] == 2


def test_late_beacon_pairs_when_it_comes(collector: Running, sender: Sender) -> None:
    tid, bspan = new_trace_id(), new_span_id()
    origin_ms = float(int(time.time() * 1000) - 30_000)
    t1 = round((origin_ms + 105.0) * MS)
    sid = server_span(
        sender.tracer("app"), tid, bspan, t1, t1 + 40 * MS, agent_attrs(t1 - MS, 9.0, 8000)
    )

    def span_stored() -> bool:
        r = httpx.get(f"{collector.query}/v1/requests/{tid}", timeout=10)
        return r.status_code == 200 and bool(r.json()["unpaired_spans"])

    wait_for(span_stored)
    time.sleep(1.0)  # well after the span's pairing round: nothing to pair it with then
    post_beacon(collector.ingest, beacon([entry(tid, bspan)], time_origin=origin_ms))
    row = listed(collector, tid)
    assert row["server_ttfb_ms"] == pytest.approx(9.0, abs=1e-3)
    assert get_detail(collector, tid)["exchanges"][0]["hops"][0]["span_id"] == sid


def test_websocket_exchanges_pair_by_sequence(collector: Running, sender: Sender) -> None:
    tid, bspan = new_trace_id(), new_span_id()
    origin_ms = float(int(time.time() * 1000) - 15_000)
    tr = sender.tracer("ws-app")
    ttfbs = {1: 4.0, 2: 6.0}
    for seq, ttfb in ttfbs.items():
        t1 = round((origin_ms + 100.0 * seq) * MS)
        server_span(
            tr,
            tid,
            bspan,
            t1,
            t1 + 30 * MS,
            agent_attrs(t1 - MS, ttfb, 8000, **{sa.WS_SEQ.name: seq}),
        )
    entries = [
        entry(
            tid,
            bspan,
            kind="websocket",
            seq=seq,
            start_ms=100.0 * seq - 2,
            request_start_ms=100.0 * seq - 2,
            response_start_ms=100.0 * seq + 10,
        )
        for seq in ttfbs
    ]
    post_beacon(collector.ingest, beacon(entries, time_origin=origin_ms)).raise_for_status()

    def both() -> dict[str, Any] | None:
        dd = get_detail(collector, tid)
        return dd if all(x["hops"] for x in dd["exchanges"]) and len(dd["exchanges"]) == 2 else None

    d = wait_for(both)
    got = {x["browser"]["seq"]: x["parts"]["server_ttfb_ms"] for x in d["exchanges"]}
    assert got == pytest.approx(ttfbs)


def test_clock_drift_reported_by_the_probe_is_applied(collector: Running, sender: Sender) -> None:
    """After sleep/resume the page's monotonic clock lags the wall clock by D and the probe
    says so (wall = time_origin + t + clock_drift_ms): θ and the entry's time must use it."""
    tid, bspan = new_trace_id(), new_span_id()
    drift = 120_000.0  # the laptop slept two minutes since the page loaded
    origin_ms = float(int(time.time() * 1000) - 10_000) + 0.25  # wall clock at t = 0, now
    theta_true, up, down = 7.0, 10.0, 10.0
    t0_abs = origin_ms + 101.0
    t_arr_ms = t0_abs + up + theta_true
    t1_ms = t_arr_ms + 1.0
    t2_ms = origin_ms + 150.0 + theta_true - down
    attrs = agent_attrs(round(t_arr_ms * MS), t2_ms - t1_ms, 8000)
    server_span(
        sender.tracer("app"), tid, bspan, round(t1_ms * MS), round(t1_ms * MS) + 60 * MS, attrs
    )
    doc = beacon([entry(tid, bspan)], time_origin=origin_ms - drift)
    doc["clock_drift_ms"] = drift
    r = post_beacon(collector.ingest, doc)
    assert r.status_code == 200 and r.json()["accepted"] == 1
    (ex,) = get_detail(collector, tid)["exchanges"]
    assert ex["parts"]["theta_ms"] == pytest.approx(theta_true, abs=0.01)  # not θ + 2 min
