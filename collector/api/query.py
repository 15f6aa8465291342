"""The private query app: the request API, /metrics, /readyz, /openapi.json, and the
routers plugins add (collector.plugins). Durations are float ms in fields ending ``_ms``.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from typing import Annotated, Any

from fastapi import Depends, FastAPI, HTTPException, Path, Query, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from pydantic import BaseModel, Field

from collector.api.llm_models import EntryLlm, HopLlm, PairLlm, entry_llm, hop_llm, pair_llm
from collector.pairing import coverage, divergence
from collector.pairing.lookups import read_span_llm, read_traces
from collector.pairing.rules import arrange, candidates, derive
from collector.plugins import Context, Plugin
from collector.store import schema
from collector.store.client import Store
from collector.store.rows import EntryRow, SpanRow
from parallax_contracts import sampling
from parallax_contracts.trace_context import is_valid_trace_id

TRACE_ID = r"^[0-9a-f]{32}$"
log = logging.getLogger("parallax.collector")


class GpuHop(BaseModel):
    """The agent's parallax.gpu.* attributes of one span (null: not measured)."""

    prefill_launches: int | None
    decode_launches: int | None
    prefill_wait_ms: float | None = Field(description="host blocked on the GPU in prefill")
    decode_wait_ms: float | None
    prefill_sm_util_pct: float | None
    decode_sm_util_pct: float | None
    sample_coverage: float | None = Field(description="share of the windows NVML covers")
    inflight_mean: float | None
    uuids: list[str]


class Hop(BaseModel):
    span_id: str
    parent_span_id: str
    service: str
    host: str
    source: str = Field(description="ebpf (the agent) or sdk")
    method: str
    route: str
    path: str
    status: int
    server_port: int
    start_unix_ms: float = Field(description="t1 (span start), Unix ms")
    arrival_unix_ms: float | None = Field(description="t_arr, Unix ms (agent only)")
    ttfb_ms: float | None = Field(description="t2 − t1 (agent)")
    ttft_ms: float | None
    duration_ms: float
    recv_queue_ms: float | None
    accept_queue_ms: float | None = Field(description="t_acc − t_est (first request only)")
    chunks: int | None
    srtt_ms: float | None
    retransmits: int | None
    ws_seq: int
    role: str = Field(description="edge, middle, origin, edge+origin, linked or reconnect")
    keep_probability: float = Field(
        1.0,
        description="the probability with which the agent kept this request (its tracestate "
        "ot=th); 1 when the span states none",
    )
    gpu: GpuHop | None = Field(
        None, description="the service's GPU activity in this request's windows (agent)"
    )
    llm: HopLlm | None = Field(None, description="its LLM stream, as the agent read it")


class BrowserEntry(BaseModel):
    site: str
    session: str
    page: str
    span_id: str
    kind: str
    seq: int
    method: str
    url: str
    route: str
    status: int | None
    time_unix_ms: float = Field(description="time_origin + start_ms")
    time_origin_unix_ms: float
    start_ms: float
    request_start_ms: float | None = Field(description="t0, ms after time_origin")
    response_start_ms: float | None = Field(description="t3, ms after time_origin")
    response_end_ms: float | None
    first_chunk_ms: float | None
    rendered_ms: float | None
    chunks: int | None
    coarse: bool
    chunks_coarse: bool
    llm: EntryLlm | None = Field(None, description="its LLM stream, as the probe read it")


class Parts(BaseModel):
    user_ttfb_ms: float | None = None
    user_ttft_ms: float | None = None
    user_visible_ttft_ms: float | None = None
    user_duration_ms: float | None = None
    user_itl_ms: list[float] = []
    render_delay_ms: float | None = None
    server_ttfb_ms: float | None = None
    server_ttft_ms: float | None = None
    server_duration_ms: float | None = None
    server_itl_ms: list[float] = []
    server_timed: bool = False
    edge_itl_ms: list[float] = []
    hop_added_ms: list[float] = []
    network_ms: float | None = None
    queue_ms: float | None = None
    accept_queue_ms: float | None = None
    recv_queue_ms: float | None = None
    retransmits: int | None = None
    srtt_ms: float | None = None
    theta_ms: float | None = None
    theta_delay_ms: float | None = None
    llm: PairLlm | None = None


_PARTS = [k for k in Parts.model_fields if k != "llm"]


class Exchange(BaseModel):
    browser: BrowserEntry
    hops: list[Hop] = Field(description="server spans of this exchange in arrival order")
    server_record: str = Field(
        coverage.PAIRED,
        description="paired (it has server spans); not_sampled (none, and the agent's "
        "sampling would have dropped this trace: the highest threshold the route's spans "
        "stated around then); missing (none, though the agent would have kept it)",
    )
    linked_span_ids: list[str]
    reconnects: int
    parts: Parts


class RequestDetail(BaseModel):
    trace_id: str
    exchanges: list[Exchange] = Field(description="one per browser entry of the trace")
    unpaired_spans: list[Hop] = Field(description="server spans no browser entry claims")


class RequestSummary(BaseModel):
    time: dt.datetime
    trace_id: str
    span_id: str
    seq: int
    site: str
    service: str
    route: str
    method: str
    status: int
    kind: str
    hops: int
    reconnects: int
    user_ttfb_ms: float | None
    server_ttfb_ms: float | None
    network_ms: float | None
    queue_ms: float | None
    user_ttft_ms: float | None
    server_ttft_ms: float | None
    user_visible_ttft_ms: float | None
    render_delay_ms: float | None
    theta_ms: float | None


class RequestList(BaseModel):
    requests: list[RequestSummary]


class HopAdded(BaseModel):
    service: str
    added_ms: float = Field(description="the time this hop adds (the origin: its t2 − t_arr)")


class SlowRequest(BaseModel):
    """One pair of a route and the parts of its divergence, as the pairs table holds them
    (null: not measured for this request — absent, not 0)."""

    time: dt.datetime
    trace_id: str = Field(description="GET /v1/requests/{trace_id} for every hop")
    span_id: str
    seq: int
    kind: str
    status: int
    user_ms: float = Field(description="the metric as the user saw it")
    server_ms: float = Field(description="the metric as the app reports it (origin hop)")
    gap_ms: float = Field(description="user_ms − server_ms")
    network_ms: float | None = Field(description="δ against the edge hop")
    queue_ms: float | None = Field(description="kernel queue wait at the origin, t1 − t_arr")
    accept_queue_ms: float | None
    recv_queue_ms: float | None
    server_ttfb_ms: float | None = Field(description="server processing, t2 − t1")
    server_ttft_ms: float | None
    render_delay_ms: float | None = Field(
        description="visible TTFT − user TTFT (an LLM stream: − its first answer token)"
    )
    hops: list[HopAdded] = Field(description="arrival order: edge … origin")
    retransmits: int | None = Field(description="TCP retransmits (edge hop)")
    srtt_ms: float | None
    wire_hold_ms: float | None = Field(description="the origin's longest write-to-wire hold")
    wire_hold_reason: str | None
    keep_probability: float = Field(description="the agent kept this request with it")
    llm_dialect: str | None = Field(description="an LLM answer's stream dialect")
    llm_queue_ms: float | None = Field(description="the engine's queue (origin)")
    llm_prefill_ms: float | None = Field(description="end of that queue → first output token")
    server_tokens: int | None
    user_token_gap_p95_ms: float | None
    server_token_gap_p95_ms: float | None


class SlowestRequests(BaseModel):
    service: str
    route: str
    metric: str
    since: dt.datetime
    until: dt.datetime
    requests: list[SlowRequest] = Field(description="slowest first, by user_ms")


def _ms(ns: Any) -> float | None:
    return None if ns is None else ns / 1e6


def _us_ms(us: Any) -> float | None:
    return None if us is None else us / 1000.0


def _hop(row: SpanRow, llm: dict[str, Any], role: str) -> Hop:
    """A hop as the API shows it: its row, and the LLM columns the store computes from it."""
    s = {**row._asdict(), **llm}
    return Hop(
        span_id=s["span_id"],
        parent_span_id=s["parent_span_id"],
        service=s["service"],
        host=s["host"],
        source=s["source"],
        method=s["method"],
        route=s["route"],
        path=s["path"],
        status=s["status"],
        server_port=s["server_port"],
        start_unix_ms=s["time"] / 1e6,
        arrival_unix_ms=_ms(s["arrival"]),
        ttfb_ms=_us_ms(s["ttfb_us"]),
        ttft_ms=_us_ms(s["ttft_us"]),
        duration_ms=s["duration_us"] / 1000.0,
        recv_queue_ms=_us_ms(s["recv_queue_us"]),
        accept_queue_ms=_us_ms(s["accept_queue_us"]),
        chunks=s["chunks"],
        srtt_ms=_us_ms(s["srtt_us"]),
        retransmits=s["retransmits"],
        ws_seq=s["ws_seq"],
        role=role,
        gpu=_gpu_hop(s),
        llm=hop_llm(s),
        keep_probability=sampling.probability(int(s.get("sample_th") or 0)),
    )


def _gpu_hop(s: dict[str, Any]) -> GpuHop | None:
    vals = {k.removeprefix("gpu_"): s.get(k) for k in _GPU_KEYS}
    if not s.get("gpu_uuid") and all(v is None for v in vals.values()):
        return None  # no GPU attributes: absent, not zeros
    return GpuHop(
        prefill_launches=vals["prefill_launches"],
        decode_launches=vals["decode_launches"],
        prefill_wait_ms=_us_ms(vals["prefill_wait_us"]),
        decode_wait_ms=_us_ms(vals["decode_wait_us"]),
        prefill_sm_util_pct=vals["prefill_sm_util_pct"],
        decode_sm_util_pct=vals["decode_sm_util_pct"],
        sample_coverage=vals["sample_coverage"],
        inflight_mean=vals["inflight_mean"],
        uuids=[u for u in str(s.get("gpu_uuid") or "").split(",") if u],
    )


_GPU_KEYS = [c.name for c in schema.SPAN_GPU_COLUMNS if c.name != "gpu_uuid"]


def _entry(row: EntryRow) -> BrowserEntry:
    e = row._asdict()
    return BrowserEntry(
        **{k: e[k] for k in BrowserEntry.model_fields if k in e},
        time_unix_ms=e["time"] / 1000.0,
        time_origin_unix_ms=e["time_origin_ms"],
        llm=entry_llm(e),
    )


def _roles(n: int) -> list[str]:
    if n == 0:  # an entry without a server span (it used to fail the zip below: a 500)
        return []
    if n == 1:
        return ["edge+origin"]
    return ["edge", *(["middle"] * (n - 2)), "origin"]


def _record(e: EntryRow, hops: list[Any], near: Callable[[EntryRow], int]) -> str:
    """paired, or why an entry has no server span (collector/pairing/coverage.py)."""
    return coverage.PAIRED if hops else coverage.status(e.trace_id, near(e))


def detail(
    trace_id: str,
    spans: list[SpanRow],
    entries: list[EntryRow],
    near: Callable[[EntryRow], int] = lambda e: 0,
    span_llm: dict[str, dict[str, Any]] | None = None,
) -> RequestDetail:
    """``near``: the sampling threshold in force around an entry without a server span;
    ``span_llm``: the spans' LLM columns by span id (lookups.read_span_llm)."""
    llm_of = span_llm or {}
    claimed: set[str] = set()
    exchanges = []
    for e in sorted(entries, key=lambda e: (e.time, e.seq)):
        cands = candidates(e, spans)
        hops, linked, reconnects = arrange(cands)
        claimed.update(s.span_id for s in cands)
        parts = derive(e, hops)._asdict()  # the pairer's derivation, all of it
        exchanges.append(
            Exchange(
                browser=_entry(e),
                hops=[
                    _hop(h, llm_of.get(h.span_id, {}), r)
                    for h, r in zip(hops, _roles(len(hops)), strict=True)
                ],
                linked_span_ids=linked,
                reconnects=reconnects,
                parts=Parts(**{k: parts[k] for k in _PARTS}, llm=pair_llm(parts)),
                server_record=_record(e, hops, near),
            )
        )
    unpaired = [
        _hop(s, llm_of.get(s.span_id, {}), "unpaired")
        for s in sorted(spans, key=lambda s: s.arrival or s.time)
        if s.span_id not in claimed
    ]
    return RequestDetail(trace_id=trace_id, exchanges=exchanges, unpaired_spans=unpaired)


_SUMMARY = list(RequestSummary.model_fields)
_SLOW_PARTS = (
    "network_ms, queue_ms, accept_queue_ms, recv_queue_ms, server_ttfb_ms, server_ttft_ms, "
    "render_delay_ms, hop_services, hop_added_ms, retransmits, srtt_ms, wire_hold_ms, "
    "wire_hold_reason, sample_th, llm_dialect, llm_queue_ms, llm_prefill_ms, server_tokens, "
    "user_token_gap_p95_ms, server_token_gap_p95_ms"
)


def _slow(r: dict[str, Any]) -> SlowRequest:
    hops = [
        HopAdded(service=str(svc), added_ms=ms)
        for svc, ms in zip(r.pop("hop_services"), r.pop("hop_added_ms"), strict=False)
    ]
    th = int(r.pop("sample_th") or 0)
    if r["time"].tzinfo is None:
        r["time"] = r["time"].replace(tzinfo=dt.UTC)
    r["wire_hold_reason"] = r["wire_hold_reason"] or None  # '' when not measured
    r["llm_dialect"] = r["llm_dialect"] or None  # '' in no dialect
    return SlowRequest(
        **r,
        gap_ms=r["user_ms"] - r["server_ms"],
        hops=hops,
        keep_probability=sampling.probability(th),
    )


def _unix_us(t: dt.datetime | None, default: dt.datetime) -> int:
    t = default if t is None else t
    if t.tzinfo is None:
        t = t.replace(tzinfo=dt.UTC)
    try:
        return max(0, min(int(t.timestamp() * 1e6), 2**62))
    except (OverflowError, ValueError, OSError):
        raise HTTPException(422, "time out of range") from None


# Module level: with postponed annotations FastAPI resolves Depends(...) in module globals.
_BEARER = HTTPBearer(auto_error=False)


def build_query_app(
    ctx: Context,
    plugins: Sequence[Plugin],
    ready: Callable[[], tuple[bool, str]],
    refresh_metrics: Callable[[], None],
) -> FastAPI:
    """The service routes, the request API, then the plugins' routers, in this order."""
    token = ctx.settings.api_token
    # With --api-token every route but /readyz needs it, the OpenAPI document too; the
    # docs pages are off then (a browser loading them cannot send the token).
    app = FastAPI(
        title="Parallax collector (query)",
        version="1",
        description="Paired server/browser timings. Durations: float ms, fields ending _ms.",
        lifespan=_plugins_lifespan(ctx, plugins),
        openapi_url=None if token else "/openapi.json",
        docs_url=None if token else "/docs",
        redoc_url=None if token else "/redoc",
    )
    app.state.parallax = ctx
    protected = [Depends(_bearer_auth(token))]
    _add_service_routes(app, protected, token, ready, refresh_metrics, ctx.registry)
    _add_slowest_route(app, protected, ctx.store)
    _add_request_routes(app, protected, ctx.store)
    for p in plugins:
        for router in p.routers:
            app.include_router(router, dependencies=protected)
    return app


def _bearer_auth(token: str | None) -> Callable[..., Awaitable[None]]:
    """The protected routes' dependency: the bearer token, when --api-token set one."""

    async def auth(
        creds: Annotated[HTTPAuthorizationCredentials | None, Depends(_BEARER)],
    ) -> None:
        if token and (creds is None or not secrets.compare_digest(creds.credentials, token)):
            raise HTTPException(
                401, "missing or wrong bearer token", {"WWW-Authenticate": "Bearer"}
            )

    return auth


def _plugins_lifespan(
    ctx: Context, plugins: Sequence[Plugin]
) -> Callable[[FastAPI], AbstractAsyncContextManager[None]]:
    """The app's lifespan: it starts the plugins' own lifespans and closes them at the end."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        # Plugins start once the store is migrated (it may be unreachable at start), and a
        # plugin that fails to start is logged, never fatal to ingest or the query API.
        stack = AsyncExitStack()
        stopping = asyncio.Event()

        async def start_plugins() -> None:
            while not ctx.migrated.is_set():
                if stopping.is_set():
                    return
                await asyncio.sleep(0.1)
            for p in plugins:
                if p.lifespan is None:
                    continue
                try:
                    await stack.enter_async_context(p.lifespan(ctx))
                except Exception as e:  # noqa: BLE001 — one line, keep serving
                    log.error("plugin %s failed to start: %s", p.name, str(e).splitlines()[0])

        task = asyncio.create_task(start_plugins())
        try:
            yield
        finally:
            stopping.set()
            await task
            await stack.aclose()

    return lifespan


def _add_service_routes(
    app: FastAPI,
    protected: list[Any],
    token: str | None,
    ready: Callable[[], tuple[bool, str]],
    refresh_metrics: Callable[[], None],
    registry: CollectorRegistry,
) -> None:
    """/openapi.json behind the token (when there is one), /readyz, /metrics."""
    if token:

        @app.get("/openapi.json", dependencies=protected, include_in_schema=False)
        async def openapi() -> dict[str, Any]:
            return app.openapi()

    @app.get("/readyz", responses={503: {"description": "store not ready"}})
    async def readyz() -> Response:
        ok, why = ready()
        return Response(
            ("ready" if ok else why) + "\n", 200 if ok else 503, media_type="text/plain"
        )

    @app.get("/metrics", dependencies=protected, response_class=Response)
    async def metrics() -> Response:
        refresh_metrics()
        return Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST)


def _add_slowest_route(app: FastAPI, protected: list[Any], store: Store) -> None:
    """GET /v1/requests/slowest (before /v1/requests/{trace_id}: routes match in order)."""

    @app.get("/v1/requests/slowest", dependencies=protected)
    async def slowest_requests(
        service: Annotated[str, Query(max_length=512)],
        route: Annotated[str, Query(max_length=512)],
        metric: Annotated[
            str, Query(pattern="^(" + "|".join(divergence.METRIC_ORDER) + ")$")
        ] = "ttfb",
        since: Annotated[
            dt.datetime | None, Query(description="ISO 8601; default: 5 minutes ago")
        ] = None,
        until: Annotated[dt.datetime | None, Query(description="ISO 8601; default: now")] = None,
        limit: Annotated[int, Query(ge=1, le=100)] = 10,
    ) -> SlowestRequests:
        """A route's slowest pairs for one metric (the user's side, slowest first) with the
        parts of each one's divergence: the drill-down from an SLA verdict to requests."""
        now = dt.datetime.now(dt.UTC)
        lo = _unix_us(since, now - dt.timedelta(minutes=5))
        hi = _unix_us(until, now)
        user, server, _ = divergence.METRICS[metric]
        sql = (
            f"SELECT time, trace_id, span_id, seq, toString(kind) AS kind, status, "  # noqa: S608
            f"toFloat64({user}) AS user_ms, toFloat64({server}) AS server_ms, {_SLOW_PARTS} "
            f"FROM {store.database}.pairs FINAL WHERE service = {{service:String}} "
            f"AND route = {{route:String}} "
            "AND time >= fromUnixTimestamp64Micro({lo:Int64}, 'UTC') "
            "AND time < fromUnixTimestamp64Micro({hi:Int64}, 'UTC') "
            f"AND {divergence.measured(metric)} AND {divergence.EXCHANGES_ONLY} "
            "ORDER BY user_ms DESC LIMIT {limit:UInt32}"
        )
        params = {"service": service, "route": route, "lo": lo, "hi": hi, "limit": limit}
        rows = await asyncio.to_thread(store.rows, sql, params)
        return SlowestRequests(
            service=service,
            route=route,
            metric=metric,
            since=dt.datetime.fromtimestamp(lo / 1e6, dt.UTC),
            until=dt.datetime.fromtimestamp(hi / 1e6, dt.UTC),
            requests=[_slow(r) for r in rows],
        )


def _add_request_routes(app: FastAPI, protected: list[Any], store: Store) -> None:
    """GET /v1/requests/{trace_id}: one request's detail; GET /v1/requests: the latest."""

    @app.get(
        "/v1/requests/{trace_id}",
        dependencies=protected,
        responses={404: {"description": "no record of this trace"}},
    )
    async def get_request(
        trace_id: Annotated[str, Path(pattern=TRACE_ID, description="32 lowercase hex")],
    ) -> RequestDetail:
        if not is_valid_trace_id(trace_id):
            raise HTTPException(422, "trace id must be 32 lowercase hex, not all zero")
        spans, entries = await asyncio.to_thread(read_traces, store, [trace_id], None)
        if not spans and not entries:
            raise HTTPException(404, "no record of this trace")
        llm = await asyncio.to_thread(read_span_llm, store, trace_id) if spans else {}

        def near(e: EntryRow) -> int:
            at = dt.datetime.fromtimestamp(e.time / 1e6, dt.UTC)
            return coverage.threshold_near(store, e.route, at)

        return await asyncio.to_thread(detail, trace_id, spans, entries, near, llm)

    @app.get("/v1/requests", dependencies=protected)
    async def list_requests(
        route: Annotated[str | None, Query(max_length=512)] = None,
        since: Annotated[
            dt.datetime | None, Query(description="ISO 8601; default: one hour ago")
        ] = None,
        limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    ) -> RequestList:
        since_us = _unix_us(since, dt.datetime.now(dt.UTC) - dt.timedelta(hours=1))
        where = "time >= fromUnixTimestamp64Micro({since:Int64}, 'UTC')"
        params: dict[str, Any] = {"since": since_us, "limit": limit}
        if route is not None:
            where += " AND route = {route:String}"
            params["route"] = route
        sql = (
            f"SELECT {', '.join(_SUMMARY)} FROM {store.database}.pairs FINAL "  # noqa: S608
            f"WHERE {where} ORDER BY time DESC LIMIT {{limit:UInt32}}"
        )
        rows = await asyncio.to_thread(store.rows, sql, params)
        for r in rows:
            if r["time"].tzinfo is None:
                r["time"] = r["time"].replace(tzinfo=dt.UTC)
        return RequestList(requests=[RequestSummary(**r) for r in rows])
