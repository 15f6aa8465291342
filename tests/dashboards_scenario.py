"""A store's worth of generated traffic for the dashboards' queries, with its ground truth.

Twenty minutes from ``anchor``:

- ``llm`` ``/v1/chat``: streamed answers on a GPU. Minutes 0–10 calm, every request traced;
  from minute 10.5 to 20 overloaded — longer queues and prefill, the GPU at 95 % and power-capped
  (its clock at 55 % of max) — and the agent keeping each request with p = 1/4 by the trace
  id's randomness (consistent sampling), so those pairs weigh 4. Every fifth request crosses
  an nginx edge that buffers the stream (it forwards the origin's writes four at a time).
- ``shop`` ``/api/cart``: plain JSON answers, no GPU, every request traced.

Browsers have their own clocks: each session's is off the servers' by a known θ (server
minus browser), one with a reported monotonic drift; the network is symmetric, so a pair's
own θ sample is exact. Spans and beacon entries are the store's real rows; the pairs come
from the collector's pairing rules (collector/pairing/rules.py), as the pairer writes them.
The agent's request counts, the GPU readings, one session's filtered θ and the SLA
checker's alert rows complete the picture. ``build`` is deterministic for a seed and anchor:
the test computes its expectations from the same objects the store is filled with.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np

from collector.pairing import rules
from collector.store import schema
from collector.store.rows import EntryRow, SpanRow
from parallax_contracts import agent_metrics as gm
from parallax_contracts import sampling
from parallax_contracts import span_attributes as sa

MS = 1_000_000  # ns
P_OVERLOAD = 0.25
TH_OVERLOAD = sampling.th_from_th32(sampling.th32_for(P_OVERLOAD))
GPU, OTHER_GPU = "GPU-a1", "GPU-z9"
# The llm origin runs in Kubernetes: the agent's Resource identity in its spans' attributes
# (the edge, nginx, runs outside: none).
LLM_POD = {
    sa.RESOURCE_CONTAINER_ID: "3f2a" * 16,
    sa.RESOURCE_K8S_NODE_NAME: "node-1",
    sa.RESOURCE_K8S_NAMESPACE_NAME: "inference",
    sa.RESOURCE_K8S_POD_NAME: "llm-5d8f7c9b6-q7x2k",
    sa.RESOURCE_K8S_CONTAINER_NAME: "llm",
    sa.RESOURCE_K8S_REPLICASET_NAME: "llm-5d8f7c9b6",
    sa.RESOURCE_K8S_DEPLOYMENT_NAME: "llm",
}
CLOCK_MAX = 1980.0
SESSIONS = {"s-east": 250.0, "s-west": -40.0, "s-north": 3.0}  # θ, ms
DRIFT = {"s-west": 2.5}  # the probe's reported monotonic-vs-wall drift, ms
FILTERED_THETA = {"s-east": 250.4}  # sla_sessions: the SLA checker's filtered θ
CHUNKS = 12
BUFFER = 4  # the edge forwards the origin's writes this many at a time


@dataclass
class Request:
    service: str
    route: str
    trace_id: str
    browser_span: str
    session: str
    t0_ns: int  # browser t0 on the server clock
    d_ms: float  # one-way network delay
    hops: list[dict[str, Any]]  # server spans (dicts in SPAN_COLUMNS names), edge first
    arrivals_ms: list[float]  # chunk arrivals on the server clock, ms since t0
    entry: dict[str, Any] = field(default_factory=dict)
    sample_th: int = 0
    gpu_busy: tuple[float, float] | None = None  # prefill, decode SM %


@dataclass
class Scenario:
    anchor: datetime
    requests: list[Request]
    span_rows: list[tuple[Any, ...]]
    entry_rows: list[tuple[Any, ...]]
    pair_rows: list[tuple[Any, ...]]
    gpu_rows: list[tuple[Any, ...]]
    count_rows: list[tuple[Any, ...]]
    alert_rows: list[dict[str, Any]]
    seen_per_10s: dict[str, float]  # calm / overload: the llm port's exact counts
    traced_per_10s: dict[str, float]

    def pairs(self) -> list[dict[str, Any]]:
        names = schema.column_names(schema.PAIR_COLUMNS)
        return [dict(zip(names, r, strict=True)) for r in self.pair_rows]


def _ns(t: datetime) -> int:
    return int(t.timestamp()) * 10**9 + t.microsecond * 1000


def _hex(rng: np.random.Generator, n: int) -> str:
    return "".join(f"{int(b):02x}" for b in rng.integers(0, 256, n // 2))


def _span(
    trace_id: str,
    span_id: str,
    parent: str,
    service: str,
    route: str,
    method: str,
    arr_ns: int,
    t1_ns: int,
    ttfb_ms: float,
    ttft_ms: float | None,
    offsets_ms: list[float],
    duration_ms: float,
    port: int,
    sample_th: int,
    gpu: dict[str, Any] | None,
) -> dict[str, Any]:
    s: dict[str, Any] = {c: None for c in schema.column_names(schema.SPAN_COLUMNS)}
    s.update(
        time=t1_ns,
        end_time=t1_ns + round(duration_ms * MS),
        received=t1_ns // MS + 500,
        trace_id=trace_id,
        span_id=span_id,
        parent_span_id=parent,
        span_name=f"{method} {route}",
        source="ebpf",
        service=service,
        host="node-1",
        pid=100,
        method=method,
        route=route,
        path=route,
        status=200,
        server_address="",
        server_port=port,
        client_address="10.0.0.9",
        client_port=40000,
        arrival=arr_ns,
        ttfb_us=round(ttfb_ms * 1000),
        recv_queue_us=round((t1_ns - arr_ns) / 1000),
        accept_queue_us=None,
        ttft_us=None if ttft_ms is None else round(ttft_ms * 1000),
        duration_us=round(duration_ms * 1000),
        chunk_offsets_us=[round(o * 1000) for o in offsets_ms],
        chunks=len(offsets_ms) or None,
        chunk_gap_max_us=None,
        srtt_us=2000,
        retransmits=0,
        ws_seq=0,
        partial=False,
        client_aborted=False,
        traceparent_missed=False,
        attributes={},
        gpu_uuid="",
        sample_th=sample_th,
    )
    s.update(gpu or {})
    return s


def _llm_request(
    rng: np.random.Generator, t0: datetime, overloaded: bool, via_edge: bool, session: str
) -> Request:
    trace_id, browser_span = _hex(rng, 32), _hex(rng, 16)
    d = float(rng.uniform(3, 8))
    queue = float(rng.uniform(5, 40) if overloaded else rng.uniform(0.2, 2))
    prefill = float(max(50.0, rng.normal(420, 90) if overloaded else rng.normal(150, 30)))
    gaps = rng.normal(25, 3, CHUNKS - 1).clip(10)
    offsets = [prefill, *(prefill + np.cumsum(gaps)).tolist()]
    duration = offsets[-1] + 1.0
    t0_ns = _ns(t0)
    edge_add = 2.0  # the proxy's own time before it forwards the request
    arr = t0_ns + round(d * MS)
    busy = (95.0, 92.0) if overloaded else (60.0, 70.0)
    gpu = {
        "gpu_prefill_sm_util_pct": busy[0],
        "gpu_decode_sm_util_pct": busy[1],
        "gpu_prefill_launches": 40,
        "gpu_decode_launches": 300,
        "gpu_sample_coverage": 1.0,
        "gpu_inflight_mean": 14.0 if overloaded else 3.0,
        "gpu_uuid": GPU,
    }
    th = TH_OVERLOAD if overloaded else 0
    hops = []
    if via_edge:
        o_arr = arr + round(edge_add * MS)
        o_t1 = o_arr + round(queue * MS)
        origin_writes = [o_t1 + round(o * MS) for o in offsets]
        # the edge forwards each group of BUFFER writes when the group's last one arrives
        fwd = [
            origin_writes[min(len(origin_writes) - 1, (i // BUFFER + 1) * BUFFER - 1)] + MS // 2
            for i in range(len(origin_writes))
        ]
        e_t1 = arr + MS // 10
        hops.append(
            _span(
                trace_id,
                _hex(rng, 16),
                browser_span,
                "nginx",
                "/v1/chat",
                "POST",
                arr,
                e_t1,
                (fwd[0] - e_t1) / MS,
                (fwd[0] - e_t1) / MS,
                [(w - e_t1) / MS for w in fwd],
                (fwd[-1] - e_t1) / MS + 1.0,
                443,
                th,
                None,
            )
        )
        writes = fwd
    else:
        o_arr, o_t1 = arr, arr + round(queue * MS)
        writes = [o_t1 + round(o * MS) for o in offsets]
    hops.append(
        _span(
            trace_id,
            _hex(rng, 16),
            browser_span,
            "llm",
            "/v1/chat",
            "POST",
            o_arr,
            o_t1,
            5.0,
            prefill,
            offsets,
            duration,
            8000,
            th,
            gpu,
        )
        | {"attributes": dict(LLM_POD)}
    )
    arrivals = [(w - t0_ns) / MS + d for w in writes]
    return Request(
        "llm", "/v1/chat", trace_id, browser_span, session, t0_ns, d, hops, arrivals,
        sample_th=th, gpu_busy=busy,
    )  # fmt: skip


def _shop_request(rng: np.random.Generator, t0: datetime, session: str) -> Request:
    trace_id, browser_span = _hex(rng, 32), _hex(rng, 16)
    d = float(rng.uniform(2, 6))
    t0_ns = _ns(t0)
    arr = t0_ns + round(d * MS)
    t1 = arr + round(float(rng.uniform(0.1, 1.0)) * MS)
    ttfb = float(rng.normal(40, 5))
    span = _span(
        trace_id, _hex(rng, 16), browser_span, "shop", "/api/cart", "GET", arr, t1, ttfb,
        None, [ttfb], ttfb + 0.5, 8080, 0, None,
    )  # fmt: skip
    arrivals = [(t1 - t0_ns) / MS + ttfb + d]
    return Request("shop", "/api/cart", trace_id, browser_span, session, t0_ns, d, [span], arrivals)


def _entry(r: Request, rng: np.random.Generator) -> dict[str, Any]:
    """The beacon's entry: browser-clock instants relative to the page's time origin."""
    theta = SESSIONS[r.session]
    drift = DRIFT.get(r.session, 0.0)
    t0_browser_ms = r.t0_ns / MS - theta  # the browser's wall clock at t0
    origin = float(np.floor(t0_browser_ms - 30_000))  # the page loaded 30 s before
    base = t0_browser_ms - origin - drift  # t0, relative to the time origin
    edge = r.hops[0]
    t2_ms = (edge["time"] + edge["ttfb_us"] * 1000) / MS
    t3 = base + (t2_ms + r.d_ms) - r.t0_ns / MS
    chunks = [base + a for a in r.arrivals_ms] if r.service == "llm" else []
    first = chunks[0] if chunks else None
    end = (chunks[-1] if chunks else base + r.arrivals_ms[-1]) + 1.0
    rendered = None if first is None else first + float(rng.uniform(8, 20))
    e: dict[str, Any] = {c: None for c in schema.column_names(schema.ENTRY_COLUMNS)}
    e.update(
        time=round((origin + drift + base - 0.5) * 1000),  # µs: start_ms is 0.5 ms before t0
        received=round(r.t0_ns / MS) + 2000,
        site="web",
        session=r.session,
        page="/",
        trace_id=r.trace_id,
        span_id=r.browser_span,
        kind="fetch",
        seq=0,
        method=r.hops[-1]["method"],
        url=f"https://example.test{r.route}",
        route=r.route,
        status=200,
        time_origin_ms=origin,
        start_ms=base - 0.5,
        request_start_ms=base,
        response_start_ms=t3,
        response_end_ms=end,
        first_chunk_ms=first,
        chunk_ms=chunks,
        chunks=len(chunks) or None,
        rendered_ms=rendered,
        coarse=False,
        chunks_coarse=False,
        hidden=False,
        transfer_size=1000,
        protocol="h2",
        server_timing="",
        error="",
        clock_drift_ms=drift or None,
        sdk="",
        # no beacon v2 llm object (the LLM columns' absent values)
        llm_dialect="",
        llm_token_ms=[],
        llm_gap_hist=[],
        llm_tokens_source="",
        llm_end="",
    )
    return e


def kept(trace_id: str, th: int) -> bool:
    return bool(sampling.keeps(trace_id, th))


def build(anchor: datetime, seed: int = 11) -> Scenario:
    rng = np.random.default_rng(seed)
    sessions = list(SESSIONS)
    reqs: list[Request] = []
    n = 0
    for minute in range(20):
        per_minute = 80 if minute >= 10 else 30
        for k in range(per_minute):
            # the overload starts half-way through minute 10: that minute mixes weights
            overloaded = minute > 10 or (minute == 10 and k >= per_minute // 2)
            t0 = anchor + timedelta(minutes=minute, seconds=(k + 0.5) * 60 / per_minute)
            r = _llm_request(rng, t0, overloaded, via_edge=n % 5 == 4, session=sessions[n % 3])
            n += 1
            if overloaded and not kept(r.trace_id, TH_OVERLOAD):
                continue  # the agent dropped it: no span, and so no pair
            reqs.append(r)
        for k in range(10):
            t0 = anchor + timedelta(minutes=minute, seconds=k * 6 + 1)
            reqs.append(_shop_request(rng, t0, sessions[k % 3]))
    span_names = schema.column_names(schema.SPAN_COLUMNS)
    entry_names = schema.column_names(schema.ENTRY_COLUMNS)
    span_rows, entry_rows = [], []
    for r in reqs:
        r.entry = _entry(r, rng)
        entry_rows.append(tuple(r.entry[c] for c in entry_names))
        span_rows += [tuple(h[c] for c in span_names) for h in r.hops]
    pair_rows, one_sided = rules.pairs_for(
        rules.by_trace(map(SpanRow._make, span_rows), map(EntryRow._make, entry_rows)),
        version=_ns(anchor) + 25 * 60 * 10**9,
    )
    assert not one_sided and len(pair_rows) == len(reqs)
    seen = {"calm": 5.0, "overload": 16.0}
    traced = {"calm": 5.0, "overload": 4.0}
    return Scenario(
        anchor,
        reqs,
        span_rows,
        entry_rows,
        [*pair_rows],
        _gpu_rows(anchor),
        _count_rows(anchor, seen, traced),
        _alerts(anchor),
        seen,
        traced,
    )


def _gpu_rows(anchor: datetime) -> list[tuple[Any, ...]]:
    """Readings every 10 s of the route's GPU (power-capped at 55 % of its max clock while
    overloaded) and of a GPU the route never ran on."""
    rows: list[tuple[Any, ...]] = []
    for k in range(-30, 121):
        t = _ns(anchor) + k * 10 * 10**9
        hot = k >= 60
        ours = (0.55 * CLOCK_MAX, 700.0, 0x4) if hot else (CLOCK_MAX, 400.0, 0)
        for hw, (clock, power, reasons) in ((GPU, ours), (OTHER_GPU, (500.0, 100.0, 0x21))):
            for metric, value in (
                (gm.GPU_SM_CLOCK.name, clock),
                (gm.GPU_SM_CLOCK_MAX.name, CLOCK_MAX),
                (gm.GPU_POWER.name, power),
                (gm.GPU_POWER_LIMIT.name, 700.0),
                (gm.GPU_CLOCK_EVENT_REASONS.name, float(reasons)),
            ):
                rows.append((t, None, "node-1", "llm", hw, "NVIDIA H200", 0, metric, value, "", {}))
    return rows


def _count_rows(
    anchor: datetime, seen: dict[str, float], traced: dict[str, float]
) -> list[tuple[Any, ...]]:
    """The agent's cumulative counters for the llm port, one export every 10 s: node-1 since
    an hour before (its first points before the port was named: service ''), node-2 an agent
    that started inside the range (its series counts from 0)."""
    rows: list[tuple[Any, ...]] = []
    a = _ns(anchor)
    n1_start = a - 3600 * 10**9
    totals = {gm.REQUESTS_SEEN.name: 10_000.0, gm.REQUESTS_TRACED.name: 9_000.0}
    for k in range(-36, 121):
        phase = "overload" if k > 60 else "calm"
        totals[gm.REQUESTS_SEEN.name] += seen[phase]
        totals[gm.REQUESTS_TRACED.name] += traced[phase]
        for metric, v in totals.items():
            svc = "" if k < -12 else "llm"
            t = a + k * 10 * 10**9
            rows.append((t, n1_start, "node-1", svc, 8000, metric, v, "cumulative"))
        p = 1.0 if phase == "calm" else P_OVERLOAD
        rows.append(
            (a + k * 10 * 10**9, None, "node-1", "", 0, gm.SAMPLING_PROBABILITY.name, p, "")
        )
    # node-2: an agent started at minute 5 (its first export 10 s later), 3 requests per
    # export, all traced
    n2_start = a + 300 * 10**9
    for j in range(1, 31):
        t = n2_start + j * 10 * 10**9
        for metric in (gm.REQUESTS_SEEN.name, gm.REQUESTS_TRACED.name):
            rows.append((t, n2_start, "node-2", "llm", 8000, metric, 3.0 * j, "cumulative"))
    return rows


def _alerts(anchor: datetime) -> list[dict[str, Any]]:
    base = {
        "severity": "critical",
        "verdict": "out_of_band",
        "band_ms": 15.0,
        "n": 400,
        "evaluator": "test",
        "ci_low_ms": 20.0,
        "ci_high_ms": 40.0,
        "user_p95_ms": 500.0,
        "server_p95_ms": 470.0,
    }

    def row(
        minute: int,
        service: str,
        route: str,
        metric: str,
        state: str,
        prev: str,
        severity: str = "critical",
    ) -> dict[str, Any]:
        t = anchor + timedelta(minutes=minute)
        return base | {
            "severity": severity,
            "time": t,
            "since": t,
            "service": service,
            "route": route,
            "metric": metric,
            "state": state,
            "previous": prev,
            "divergence_ms": 30.0,
            "sentence": f"{route} ({service}): {metric} {state}",
        }

    return [
        row(12, "llm", "/v1/chat", "ttft", "pending", "inactive"),
        row(14, "llm", "/v1/chat", "ttft", "firing", "pending"),
        row(3, "shop", "/api/cart", "ttfb", "firing", "pending"),
        row(8, "shop", "/api/cart", "ttfb", "resolved", "firing"),
        # a warning escalated: its resolve and the critical's firing at one instant
        row(15, "llm", "/v1/chat", "ttfb", "firing", "pending", "warning"),
        row(18, "llm", "/v1/chat", "ttfb", "resolved", "firing", "warning"),
        row(18, "llm", "/v1/chat", "ttfb", "firing", "resolved"),
        # a traffic dip: held firing for lack of data
        row(4, "shop", "/api/cart", "itl", "firing", "pending"),
        row(9, "shop", "/api/cart", "itl", "insufficient_data", "firing"),
    ]


def fill(store: Any, sc: Scenario) -> None:
    """Write the scenario into a migrated store (the SLA tables ensured)."""
    names = schema.column_names
    store.insert_rows("server_spans", sc.span_rows, names(schema.SPAN_COLUMNS))
    store.insert_rows("browser_entries", sc.entry_rows, names(schema.ENTRY_COLUMNS))
    store.insert_rows("pairs", sc.pair_rows, names(schema.PAIR_COLUMNS))
    store.insert_rows("gpu_samples", sc.gpu_rows, names(schema.GPU_SAMPLE_COLUMNS))
    store.insert_rows("request_counts", sc.count_rows, names(schema.REQUEST_COUNT_COLUMNS))
    c = store.client()
    cols = list(sc.alert_rows[0])
    c.insert(
        f"{store.database}.sla_alerts",
        [[r[k] for k in cols] for r in sc.alert_rows],
        column_names=cols,
    )
    for session, theta in FILTERED_THETA.items():
        c.insert(
            f"{store.database}.sla_sessions",
            [[session, "web", [], [], [], theta, 1.0, 8, sc.anchor, 1]],
            column_names=[
                "session", "site", "routes", "best", "best_ms", "theta_ms", "delay_ms",
                "used", "last_seen", "version",
            ],
        )  # fmt: skip


def anchor_now() -> datetime:
    """A whole minute 40 minutes ago: recent (the tables' TTL), in the past (no clock skew)."""
    return (datetime.now(UTC) - timedelta(minutes=40)).replace(second=0, microsecond=0)
