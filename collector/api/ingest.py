"""The public ingest app: ``POST /v1/traces`` (OTLP/HTTP), ``POST /v1/beacons``, ``/healthz``.

Nothing else is served on this port (no docs, no OpenAPI, no query API).
"""

from __future__ import annotations

import json
import logging
import time
import zlib
from typing import Any

from fastapi import FastAPI, Request, Response
from google.rpc import status_pb2  # type: ignore[import-untyped]

from collector.config import Settings
from collector.ingest import beacons, otlp
from collector.ingest.common import BadRequestError, Parsed
from collector.metrics import Metrics
from collector.pipeline import (
    ENTRIES,
    KIND_BEACON,
    KIND_OTLP_JSON,
    KIND_OTLP_PROTO,
    SPANS,
    Pipeline,
    SpoolFullError,
)
from collector.ratelimit import RateLimiter, retry_after

log = logging.getLogger("parallax.collector")
_DAY_NS = 86_400 * 10**9


class TooLargeError(Exception):
    pass


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


def span_key(r: tuple[Any, ...]) -> str:
    return f"{r[3]}{r[4]}"


def entry_key(r: tuple[Any, ...]) -> str:
    return f"{r[5]}{r[6]}{r[8]}"


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
            p = beacons.parse(beacons.load(body), received_ns, oldest, now)
            return _dedup_entries(p, self.replay_entries)
        p = otlp.parse(body, kind == KIND_OTLP_JSON, received_ns, oldest, now)
        return _dedup_spans(p, self.replay_spans)


def _dedup_spans(p: Parsed, recent: RecentIds) -> Parsed:
    keep = [r for r in p.rows if recent.fresh(span_key(r))]
    if len(keep) != len(p.rows):
        p.rows = keep
        p.trace_ids = [r[3] for r in keep]
    return p


def _dedup_entries(p: Parsed, recent: RecentIds) -> Parsed:
    keep = [r for r in p.rows if recent.fresh(entry_key(r))]
    if len(keep) != len(p.rows):
        p.rows = keep
        p.trace_ids = [r[5] for r in keep]
    return p


async def _read_body(request: Request, limit: int) -> bytes:
    """The (decompressed) body, refusing more than ``limit`` bytes either way."""
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise TooLargeError
    chunks = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise TooLargeError
        chunks.append(chunk)
    body = b"".join(chunks)
    enc = request.headers.get("content-encoding", "identity").lower()
    if enc == "gzip":
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            body = d.decompress(body, limit + 1)
        except zlib.error as e:
            raise BadRequestError(f"malformed gzip body: {e}") from None
        if len(body) > limit or d.unconsumed_tail:
            raise TooLargeError
    elif enc not in ("identity", ""):
        raise BadRequestError(f"unsupported Content-Encoding {enc!r} (gzip or identity)")
    return body


def _client_ip(request: Request) -> str:
    return request.client.host if request.client else "?"


def build_ingest_app(settings: Settings, ingest: Ingest, pipeline: Pipeline) -> FastAPI:
    app = FastAPI(
        title="Parallax collector (ingest)", openapi_url=None, docs_url=None, redoc_url=None
    )
    metrics = ingest.metrics
    limiter = RateLimiter(settings.rate_per_s, settings.rate_burst)
    allowed_origins = {o for origins in settings.sites.values() for o in origins}

    def refuse(
        endpoint: str,
        code: int,
        reason: str,
        headers: dict[str, str] | None = None,
        otlp_json: bool | None = None,
    ) -> Response:
        metrics.requests_refused.labels(endpoint, str(code)).inc()
        if otlp_json is not None:  # OTLP wants a google.rpc.Status body
            st = status_pb2.Status(
                code=3 if code == 400 else 8 if code == 429 else 13, message=reason
            )
            if otlp_json:
                body = json.dumps({"code": st.code, "message": reason}).encode()
                return Response(body, code, headers, media_type="application/json")
            return Response(
                st.SerializeToString(), code, headers, media_type="application/x-protobuf"
            )
        return Response(reason + "\n", code, headers, media_type="text/plain")

    @app.get("/healthz")
    async def healthz() -> Response:
        return Response("ok\n", media_type="text/plain")

    @app.post("/v1/traces")
    async def traces(request: Request) -> Response:
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        is_json = ctype == "application/json"
        if settings.otlp_token and request.headers.get("authorization") != (
            f"Bearer {settings.otlp_token}"
        ):
            return refuse(
                "traces",
                401,
                "missing or wrong bearer token",
                {"WWW-Authenticate": "Bearer"},
                is_json,
            )
        wait = limiter.take(_client_ip(request))
        if wait:
            return refuse(
                "traces", 429, "rate limit exceeded", {"Retry-After": retry_after(wait)}, is_json
            )
        if ctype not in ("application/x-protobuf", "application/json"):
            return refuse(
                "traces", 415, "Content-Type must be application/x-protobuf or application/json"
            )
        received = time.time_ns()
        try:
            body = await _read_body(request, settings.max_otlp_bytes)
            parsed = otlp.parse(body, is_json, received, *ingest._window())
        except TooLargeError:
            return refuse(
                "traces", 413, f"body over {settings.max_otlp_bytes} bytes", None, is_json
            )
        except BadRequestError as e:
            return refuse("traces", 400, str(e), None, is_json)
        n_in = len(parsed.rows) + parsed.rejected_total
        metrics.received.labels(SPANS).inc(n_in)
        _dedup_spans(parsed, ingest.recent_spans)
        try:
            pipeline.accept(KIND_OTLP_JSON if is_json else KIND_OTLP_PROTO, body, received, parsed)
        except SpoolFullError:
            return refuse(
                "traces", 503, "spool full: the store is unreachable", {"Retry-After": "5"}, is_json
            )
        for reason, n in parsed.rejected.items():
            metrics.rejected.labels(SPANS, reason).inc(n)
        if parsed.ignored:
            metrics.ignored.inc(parsed.ignored)
        msg = ", ".join(f"{n} {r}" for r, n in sorted(parsed.rejected.items()))
        content, media = otlp.response(parsed.rejected_total, msg, is_json)
        return Response(content, 200, media_type=media)

    def cors_headers(origin: str | None) -> dict[str, str]:
        if not origin:
            return {}
        return {"Access-Control-Allow-Origin": origin, "Vary": "Origin"}

    def origin_allowed(origin: str | None, site: str | None = None) -> bool:
        if not settings.sites or origin is None:
            return True
        if site is not None:
            return origin in settings.sites.get(site, [])
        return origin in allowed_origins

    @app.options("/v1/beacons")
    async def beacons_preflight(request: Request) -> Response:
        origin = request.headers.get("origin")
        if not origin_allowed(origin):
            return refuse("beacons", 403, "origin not allowed")
        return Response(
            status_code=204,
            headers={
                **cors_headers(origin),
                "Access-Control-Allow-Methods": "POST",
                "Access-Control-Allow-Headers": "Content-Type",
                "Access-Control-Max-Age": "86400",
            },
        )

    @app.post("/v1/beacons")
    async def beacons_post(request: Request) -> Response:
        origin = request.headers.get("origin")
        wait = limiter.take(_client_ip(request))
        if wait:
            return refuse(
                "beacons",
                429,
                "rate limit exceeded",
                {"Retry-After": retry_after(wait), **cors_headers(origin)},
            )
        ctype = request.headers.get("content-type", "").split(";")[0].strip().lower()
        if ctype not in ("text/plain", "application/json"):
            return refuse("beacons", 415, "Content-Type must be text/plain or application/json")
        received = time.time_ns()
        try:
            body = await _read_body(request, settings.max_beacon_bytes)
            doc = beacons.load(body)
            site = doc.get("site")
            if settings.sites and site not in settings.sites:
                return refuse("beacons", 403, "unknown site key")
            if not origin_allowed(origin, str(site)):
                return refuse("beacons", 403, "origin not allowed for this site")
            parsed = beacons.parse(doc, received, *ingest._window())
        except TooLargeError:
            return refuse(
                "beacons", 413, f"body over {settings.max_beacon_bytes} bytes", cors_headers(origin)
            )
        except BadRequestError as e:
            return refuse("beacons", 400, str(e), cors_headers(origin))
        accepted = len(parsed.rows)
        metrics.received.labels(ENTRIES).inc(accepted + parsed.rejected_total)
        _dedup_entries(parsed, ingest.recent_entries)
        try:
            pipeline.accept(KIND_BEACON, body, received, parsed)
        except SpoolFullError:
            return refuse(
                "beacons",
                503,
                "spool full: the store is unreachable",
                {"Retry-After": "5", **cors_headers(origin)},
            )
        for reason, n in parsed.rejected.items():
            metrics.rejected.labels(ENTRIES, reason).inc(n)
        out = {
            "accepted": accepted,
            "rejected": parsed.rejected_total,
            "reasons": dict(parsed.rejected),
        }
        return Response(json.dumps(out), 200, cors_headers(origin), media_type="application/json")

    return app
