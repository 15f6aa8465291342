"""The public ingest app: ``POST /v1/traces`` and ``POST /v1/metrics`` (OTLP/HTTP),
``POST /v1/beacons``, ``/healthz``.

Nothing else is served on this port (no docs, no OpenAPI, no query API).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from google.rpc import status_pb2  # type: ignore[import-untyped]

from collector.config import Settings
from collector.ingest import beacons, otlp, otlp_metrics
from collector.ingest.common import BadRequestError, Parsed
from collector.metrics import Metrics
from collector.pipeline import (
    ENTRIES,
    GPU_SAMPLES,
    KIND_BEACON,
    KIND_METRICS_JSON,
    KIND_METRICS_PROTO,
    KIND_OTLP_JSON,
    KIND_OTLP_PROTO,
    SPANS,
    Pipeline,
    SpoolFullError,
)
from collector.ratelimit import RateLimiter, retry_after
from collector.store.rows import EntryRow, SpanRow

log = logging.getLogger("parallax.collector")
_DAY_NS = 86_400 * 10**9
# While the spool cannot keep a request (store down long, disk full): come back in 5 s.
RETRY_AFTER_S = "5"
_SLOW_BODY = "request body not received in time"
# After an early answer, what is left of a body is read and dropped for at most this long
# (or --body-timeout, if shorter) and this much (nginx's lingering close: 5 s between reads,
# 30 s in all): enough for an honest client to finish its send, little for a hostile one.
LINGER_S = 5.0
LINGER_BYTES = 64 << 20
# google.rpc.Code of an OTLP refusal: INVALID_ARGUMENT, DEADLINE_EXCEEDED,
# RESOURCE_EXHAUSTED, UNAVAILABLE; INTERNAL otherwise.
_RPC_CODE = {400: 3, 408: 4, 429: 8, 503: 14}


class TooLargeError(Exception):
    pass


class BodyTimeoutError(Exception):
    """The body did not arrive within --body-timeout (a slow-body client): 408."""


class RecentIds:
    """Ids seen in the last two generations: drops a client's retry of what it already sent
    before it reaches the store (ReplacingMergeTree collapses what slips through)."""

    def __init__(self, per_generation: int = 500_000):
        self.cap = per_generation
        self.cur: set[str] = set()
        self.old: set[str] = set()

    def fresh(self, key: str) -> bool:
        if key in self.cur or key in self.old:
            return False
        self.cur.add(key)
        if len(self.cur) >= self.cap:
            self.old, self.cur = self.cur, set()
        return True


# The parsers' rows are plain tuples in column order (the compiled decoder makes them):
# the fields the ids are made of, by name (collector/store/rows.py).
_S_TRACE, _S_SPAN = (SpanRow._fields.index(n) for n in ("trace_id", "span_id"))
_E_TRACE, _E_SPAN, _E_SEQ = (EntryRow._fields.index(n) for n in ("trace_id", "span_id", "seq"))


def span_key(r: tuple[Any, ...]) -> str:
    return f"{r[_S_TRACE]}{r[_S_SPAN]}"


def entry_key(r: tuple[Any, ...]) -> str:
    return f"{r[_E_TRACE]}{r[_E_SPAN]}{r[_E_SEQ]}"


class Ingest:
    """Parsing, validation and spooling; shared by the HTTP handlers and spool replay
    (``parse`` is the replay's: it re-reads a spooled body)."""

    def __init__(self, settings: Settings, metrics: Metrics):
        self.settings = settings
        self.metrics = metrics
        self.recent_spans = RecentIds()
        self.recent_entries = RecentIds()
        # Spool replay has its own: the live sets already hold every id that was accepted,
        # and would drop a whole segment re-read from disk (one that did not fit in memory).
        self.replay_spans = RecentIds()
        self.replay_entries = RecentIds()
        self.pipeline: Pipeline | None = None

    def _window(self) -> tuple[int, int]:
        now = time.time_ns()
        return now - self.settings.retention_days * _DAY_NS, now

    def parse(self, kind: int, body: bytes, received_ns: int) -> Parsed:
        oldest, now = self._window()
        if kind == KIND_BEACON:
            p = beacons.parse(beacons.read(body), received_ns, oldest, now)
            return _dedup_entries(p, self.replay_entries)
        if kind in (KIND_METRICS_PROTO, KIND_METRICS_JSON):
            # no id to deduplicate by: a retried export collapses in gpu_samples' sort key
            return otlp_metrics.parse(body, kind == KIND_METRICS_JSON, received_ns, oldest, now)
        p = otlp.parse(body, kind == KIND_OTLP_JSON, received_ns, oldest, now)
        return _dedup_spans(p, self.replay_spans)


def _dedup(
    p: Parsed, recent: RecentIds, key: Callable[[tuple[Any, ...]], str], trace: int
) -> Parsed:
    """``p`` without the rows ``recent`` has seen (by ``key``); ``trace``: where a row holds
    its trace id (the parsers' rows are plain tuples in their table's column order)."""
    keep = [r for r in p.rows if recent.fresh(key(r))]
    if len(keep) != len(p.rows):
        p.rows = keep
        p.trace_ids = [r[trace] for r in keep]
    return p


def _dedup_spans(p: Parsed, recent: RecentIds) -> Parsed:
    return _dedup(p, recent, span_key, _S_TRACE)


def _dedup_entries(p: Parsed, recent: RecentIds) -> Parsed:
    return _dedup(p, recent, entry_key, _E_TRACE)


Headers = dict[str, str]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class ClientGoneError(Exception):
    """The client disconnected before its body was read: nothing to answer."""


class _Request:
    """What the handlers need of one ASGI HTTP request (the first value of each header), and
    whether its body has been read to the end (``body_done``: see ``linger``)."""

    __slots__ = ("_receive", "body_done", "client_ip", "headers")

    def __init__(self, scope: dict[str, Any], receive: Receive):
        h: Headers = {}
        for k, v in scope["headers"]:
            h.setdefault(k.decode("latin-1").lower(), v.decode("latin-1"))
        self.headers = h
        self._receive = receive
        client = scope.get("client")
        self.client_ip: str = client[0] if client else "?"
        self.body_done = "transfer-encoding" not in h and h.get("content-length", "0") == "0"

    async def receive(self) -> dict[str, Any]:
        msg = await self._receive()
        if msg["type"] == "http.disconnect" or not msg.get("more_body", False):
            self.body_done = True
        return msg

    async def linger(self, timeout_s: float) -> None:
        """Read and drop what is left of the body after an early answer, until its end, the
        client's disconnect, ``LINGER_BYTES`` or ``timeout_s``. A socket closed with unread
        bytes sends a reset instead of a FIN, and the server (hyper) closes so when the app
        leaves the body unread: the client's send breaks, and its kernel may drop the answer
        before the client reads it (docs/collector.md, "Early answers")."""
        drained = 0
        try:
            async with asyncio.timeout(timeout_s):
                while not self.body_done and drained <= LINGER_BYTES:
                    drained += len((await self.receive()).get("body", b""))
        except TimeoutError:
            pass
        except asyncio.CancelledError:
            # the server cancels a pending read when the connection ends; only a
            # cancellation of this task itself (shutdown) goes on
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise


class _Response:
    __slots__ = ("body", "headers", "media_type", "status")

    def __init__(
        self,
        body: bytes | str = b"",
        status: int = 200,
        headers: Headers | None = None,
        media_type: str | None = None,
    ):
        self.body = body.encode() if isinstance(body, str) else body
        self.status = status
        self.headers = headers or {}
        self.media_type = media_type

    async def send(self, send: Send) -> None:
        raw = [(b"content-length", str(len(self.body)).encode())]
        if self.media_type:
            mt = self.media_type
            if mt.startswith("text/"):
                mt += "; charset=utf-8"
            raw.append((b"content-type", mt.encode()))
        raw += [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in self.headers.items()]
        await send({"type": "http.response.start", "status": self.status, "headers": raw})
        await send({"type": "http.response.body", "body": self.body})


async def _read_body(request: _Request, limit: int, timeout_s: float) -> bytes:
    """The (decompressed) body, refusing more than ``limit`` bytes either way, and a body
    that takes longer than ``timeout_s`` to arrive (the server bounds the headers)."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise TooLargeError
    chunks = []
    size = 0
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                msg = await request.receive()
                if msg["type"] == "http.disconnect":
                    raise ClientGoneError
                chunk = msg.get("body", b"")
                size += len(chunk)
                if size > limit:
                    raise TooLargeError
                chunks.append(chunk)
                if not msg.get("more_body", False):
                    break
    except TimeoutError:
        raise BodyTimeoutError from None
    body = b"".join(chunks)
    enc = request.headers.get("content-encoding", "identity").lower()
    if enc == "gzip":
        return _gunzip(body, limit)
    if enc not in ("identity", ""):
        raise BadRequestError(f"unsupported Content-Encoding {enc!r} (gzip or identity)")
    return body


def _gunzip(data: bytes, limit: int) -> bytes:
    """Every member of a gzip body (RFC 1952 allows several: ``cat a.gz b.gz``), at most
    ``limit`` bytes inflated. A truncated member, or bytes after the last one that are not
    a member, is a 400: never a part of the body taken for the whole."""
    out = []
    size = 0
    while True:
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            part = d.decompress(data, limit + 1 - size)  # ≥ 1 here: 0 would mean "no limit"
        except zlib.error as e:
            raise BadRequestError(f"malformed gzip body: {e}") from None
        size += len(part)
        if size > limit or d.unconsumed_tail:
            raise TooLargeError
        if not d.eof:
            raise BadRequestError("truncated gzip body")
        out.append(part)
        data = d.unused_data
        if not data:
            return b"".join(out)


Handler = Callable[[_Request], Awaitable[_Response]]


@dataclass(frozen=True, slots=True)
class _Signal:
    """One OTLP signal on the ingest port: what differs between /v1/traces and /v1/metrics."""

    endpoint: str  # the refusal counter's label
    source: str  # the pipeline source: the received/rejected counters' label
    kinds: tuple[int, int]  # spool record kinds: (protobuf, JSON)
    parse: Callable[[bytes, bool, int, int, int], Parsed]
    response: Callable[[int, str, bool], tuple[bytes, str]]
    dedup: Callable[[Parsed], object] | None  # drops a client's retry before the spool
    count_ignored: Callable[[Parsed], None]


class IngestApp:
    """A plain ASGI app: a few endpoints need no framework, and a web framework's routing,
    middleware and request objects cost more CPU per request than parsing a beacon of a
    few entries (measured: docs/collector.md, Performance)."""

    def __init__(self, routes: dict[tuple[str, str], Handler], linger_s: float = LINGER_S):
        self.routes = routes
        self.linger_s = linger_s
        self.paths = {path for _, path in routes}
        self._logged: dict[tuple[str, str], float] = {}

    async def __call__(self, scope: dict[str, Any], receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind == "lifespan":
            while True:
                msg = await receive()
                if msg["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif msg["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        if kind != "http":
            return  # no WebSocket here; the server closes it
        path, method = scope["path"], scope["method"]
        handler = self.routes.get((method, path))
        if handler is None and method == "HEAD":
            handler = self.routes.get(("GET", path))
        if handler is None:
            if path in self.paths:
                allow = ", ".join(sorted(m for m, p in self.routes if p == path))
                resp = _Response('{"detail":"Method Not Allowed"}', 405, {"Allow": allow})
            else:
                resp = _Response('{"detail":"Not Found"}', 404)
            resp.media_type = "application/json"
            await resp.send(send)
            await _Request(scope, receive).linger(self.linger_s)
            return
        request = _Request(scope, receive)
        try:
            resp = await handler(request)
        except ClientGoneError:
            return
        except Exception as e:
            # A bug, not bad input: one traceback per error type a minute, not one per
            # request (a flood of them is the next outage).
            key = (type(e).__name__, path)
            now = time.monotonic()
            if now - self._logged.get(key, -60.0) >= 60.0:
                self._logged[key] = now
                log.exception("ingest: %s %s failed (said once a minute)", method, path)
            resp = _Response("Internal Server Error", 500, media_type="text/plain")
        await resp.send(send)
        if not request.body_done:
            await request.linger(self.linger_s)


def build_ingest_app(settings: Settings, ingest: Ingest, pipeline: Pipeline) -> IngestApp:
    """The ingest port's routes: /healthz, the two OTLP signals and the beacons, all under
    one rate limit per client IP."""
    shared = _Shared(settings, ingest, pipeline)
    beacon_routes = _Beacons(shared)
    return IngestApp(
        {
            ("GET", "/healthz"): _healthz,
            ("POST", "/v1/traces"): _traces(shared),
            ("POST", "/v1/metrics"): _metric_points(shared),
            ("OPTIONS", "/v1/beacons"): beacon_routes.preflight,
            ("POST", "/v1/beacons"): beacon_routes.post,
        },
        linger_s=min(LINGER_S, settings.body_timeout_s),
    )


async def _healthz(request: _Request) -> _Response:
    return _Response("ok\n", media_type="text/plain")


class _Shared:
    """What every ingest endpoint uses: the settings, the parser and its recent ids, the
    spool pipeline, one rate limit per client IP across the endpoints, and the refusal."""

    def __init__(self, settings: Settings, ingest: Ingest, pipeline: Pipeline):
        self.settings = settings
        self.ingest = ingest
        self.pipeline = pipeline
        self.metrics = ingest.metrics
        self.limiter = RateLimiter(settings.rate_per_s, settings.rate_burst)

    def refuse(
        self,
        endpoint: str,
        code: int,
        reason: str,
        headers: Headers | None = None,
        otlp_json: bool | None = None,
    ) -> _Response:
        """A refused request, counted; an OTLP one (``otlp_json`` not None) answered with a
        google.rpc.Status body in the request's encoding, any other in plain text."""
        self.metrics.requests_refused.labels(endpoint, str(code)).inc()
        if otlp_json is not None:
            st = status_pb2.Status(code=_RPC_CODE.get(code, 13), message=reason)
            if otlp_json:
                body = json.dumps({"code": st.code, "message": reason}).encode()
                return _Response(body, code, headers, media_type="application/json")
            return _Response(
                st.SerializeToString(), code, headers, media_type="application/x-protobuf"
            )
        return _Response(reason + "\n", code, headers, media_type="text/plain")


# --- OTLP: POST /v1/traces, /v1/metrics -------------------------------------------------
def _traces(shared: _Shared) -> Handler:
    metrics, recent = shared.metrics, shared.ingest.recent_spans

    def spans_ignored(parsed: Parsed) -> None:
        if parsed.ignored:
            metrics.ignored.inc(parsed.ignored)

    return _otlp_endpoint(
        shared,
        _Signal(
            "traces",
            SPANS,
            (KIND_OTLP_PROTO, KIND_OTLP_JSON),
            otlp.parse,
            otlp.response,
            lambda p: _dedup_spans(p, recent),
            spans_ignored,
        ),
    )


def _metric_points(shared: _Shared) -> Handler:
    metrics = shared.metrics

    def points_ignored(parsed: Parsed) -> None:
        for reason, n in parsed.ignored_reasons.items():
            metrics.points_ignored.labels(reason).inc(n)

    return _otlp_endpoint(
        shared,
        _Signal(
            "metrics",
            GPU_SAMPLES,
            (KIND_METRICS_PROTO, KIND_METRICS_JSON),
            otlp_metrics.parse,
            otlp_metrics.response,
            None,  # a retried export collapses in gpu_samples' sort key (ReplacingMergeTree)
            points_ignored,
        ),
    )


def _otlp_endpoint(shared: _Shared, sig: _Signal) -> Handler:
    """POST /v1/traces and /v1/metrics: the same auth, limits, spooling and answers."""
    settings, ingest, pipeline = shared.settings, shared.ingest, shared.pipeline
    metrics, limiter, refuse = shared.metrics, shared.limiter, shared.refuse
    received_rows = metrics.received.labels(sig.source)
    name = sig.endpoint

    async def handle(request: _Request) -> _Response:
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        is_json = ctype == "application/json"
        if settings.otlp_token and request.headers.get("authorization") != (
            f"Bearer {settings.otlp_token}"
        ):
            return refuse(
                name,
                401,
                "missing or wrong bearer token",
                {"WWW-Authenticate": "Bearer"},
                is_json,
            )
        wait = limiter.take(request.client_ip)
        if wait:
            return refuse(
                name, 429, "rate limit exceeded", {"Retry-After": retry_after(wait)}, is_json
            )
        if ctype not in ("application/x-protobuf", "application/json"):
            return refuse(
                name, 415, "Content-Type must be application/x-protobuf or application/json"
            )
        received = time.time_ns()
        try:
            body = await _read_body(request, settings.max_otlp_bytes, settings.body_timeout_s)
            parsed = sig.parse(body, is_json, received, *ingest._window())
        except TooLargeError:
            return refuse(name, 413, f"body over {settings.max_otlp_bytes} bytes", None, is_json)
        except BodyTimeoutError:
            return refuse(name, 408, _SLOW_BODY, {"Connection": "close"}, is_json)
        except BadRequestError as e:
            return refuse(name, 400, str(e), None, is_json)
        received_rows.inc(parsed.row_count + parsed.rejected_total)
        if sig.dedup is not None:
            sig.dedup(parsed)
        try:
            pipeline.accept(sig.kinds[is_json], body, received, parsed)
        except SpoolFullError as e:
            return refuse(name, 503, str(e), {"Retry-After": RETRY_AFTER_S}, is_json)
        for reason, n in parsed.rejected.items():
            metrics.rejected.labels(sig.source, reason).inc(n)
        sig.count_ignored(parsed)
        msg = ", ".join(f"{n} {r}" for r, n in sorted(parsed.rejected.items()))
        content, media = sig.response(parsed.rejected_total, msg, is_json)
        return _Response(content, 200, media_type=media)

    return handle


# --- browser beacons: OPTIONS and POST /v1/beacons ---------------------------------------
def _cors_headers(origin: str | None) -> Headers:
    if not origin:
        return {}
    return {"Access-Control-Allow-Origin": origin, "Vary": "Origin"}


class _Beacons:
    """The beacon endpoints: the CORS preflight and the POST, each site's origins checked
    (--site; none given: any origin, any site)."""

    def __init__(self, shared: _Shared):
        self.settings, self.ingest, self.pipeline = shared.settings, shared.ingest, shared.pipeline
        self.metrics, self.limiter, self.refuse = shared.metrics, shared.limiter, shared.refuse
        self.received_entries = shared.metrics.received.labels(ENTRIES)
        self.sites = shared.settings.sites
        self.allowed_origins = {o for origins in self.sites.values() for o in origins}

    def origin_allowed(self, origin: str | None, site: str | None = None) -> bool:
        if not self.sites or origin is None:
            return True
        if site is not None:
            return origin in self.sites.get(site, [])
        return origin in self.allowed_origins

    async def preflight(self, request: _Request) -> _Response:
        origin = request.headers.get("origin")
        if not self.origin_allowed(origin):
            return self.refuse("beacons", 403, "origin not allowed")
        return _Response(
            status=204,
            headers={
                **_cors_headers(origin),
                "Access-Control-Allow-Methods": "POST",
                "Access-Control-Allow-Headers": "Content-Type",
                "Access-Control-Max-Age": "86400",
            },
        )

    async def post(self, request: _Request) -> _Response:
        settings, refuse = self.settings, self.refuse
        origin = request.headers.get("origin")
        wait = self.limiter.take(request.client_ip)
        if wait:
            return refuse(
                "beacons",
                429,
                "rate limit exceeded",
                {"Retry-After": retry_after(wait), **_cors_headers(origin)},
            )
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype not in ("text/plain", "application/json"):
            return refuse("beacons", 415, "Content-Type must be text/plain or application/json")
        received = time.time_ns()
        try:
            body = await _read_body(request, settings.max_beacon_bytes, settings.body_timeout_s)
            doc = beacons.read(body)
            site = beacons.site_of(doc)
            if settings.sites and site not in settings.sites:
                return refuse("beacons", 403, "unknown site key")
            if not self.origin_allowed(origin, str(site)):
                return refuse("beacons", 403, "origin not allowed for this site")
            parsed = beacons.parse(doc, received, *self.ingest._window())
        except TooLargeError:
            return refuse(
                "beacons",
                413,
                f"body over {settings.max_beacon_bytes} bytes",
                _cors_headers(origin),
            )
        except BodyTimeoutError:
            return refuse(
                "beacons", 408, _SLOW_BODY, {"Connection": "close", **_cors_headers(origin)}
            )
        except BadRequestError as e:
            return refuse("beacons", 400, str(e), _cors_headers(origin))
        accepted = len(parsed.rows)
        self.received_entries.inc(accepted + parsed.rejected_total)
        _dedup_entries(parsed, self.ingest.recent_entries)
        try:
            self.pipeline.accept(KIND_BEACON, body, received, parsed)
        except SpoolFullError as e:
            return refuse(
                "beacons", 503, str(e), {"Retry-After": RETRY_AFTER_S, **_cors_headers(origin)}
            )
        for reason, n in parsed.rejected.items():
            self.metrics.rejected.labels(ENTRIES, reason).inc(n)
        self.metrics.genai_client.observe_rows(parsed.rows)  # the LLM streams' tokens (kept rows)
        out = {
            "accepted": accepted,
            "rejected": parsed.rejected_total,
            "reasons": dict(parsed.rejected),
        }
        return _Response(json.dumps(out), 200, _cors_headers(origin), media_type="application/json")
