"""Browser beacons (v1 JSON Schema) → ``browser_entries`` rows.

The schema is the contract (parallax_contracts.beacon); the hot path asks
collector.ingest.beacon_check, which answers the same yes/no, and only a body it refuses is
explained by the schema's validator. An error in the envelope (or an unknown version)
rejects the body with 400; an error inside one entry rejects that entry only.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from typing import Annotated, Any, Literal
from urllib.parse import urlparse

import msgspec
import orjson
from msgspec import Meta

from collector.ingest import beacon_check
from collector.ingest.common import FUTURE_SLACK_NS, MAX_DURATION_NS, BadRequestError, Parsed
from parallax_contracts import beacon
from parallax_contracts.routes import route_template
from parallax_contracts.trace_context import is_valid_span_id, is_valid_trace_id

_ENTRY_ERR = re.compile(r"^entries/(\d+)(/|:)")
_MAX_DURATION_MS = MAX_DURATION_NS / 1e6


# --- the typed fast path ---------------------------------------------------------------
# msgspec decodes a beacon straight into these structs, checking each value as it reads it
# (≈ 1.7 µs per entry, against ≈ 4.5 for orjson plus the hand-written check). They accept a
# subset of what the schema accepts — never more: an integer written as 1.0, a null, a lone
# surrogate, an invalid entry among valid ones all fail here and take the dict path below,
# which rejects per entry and explains with the schema. (tests/collector/test_beacon_check.py
# holds the two paths to the same rows.) `\Z`, not `$`: msgspec searches with Python's re,
# where `$` also matches before a trailing newline and the schema's (ECMA-262) does not.
_N: Any = None  # an absent field reads None; an explicit null is refused (not in the schema)
_Ms = Annotated[float, Meta(ge=0, le=beacon_check.MS_MAX)]
_U32 = Annotated[int, Meta(ge=0, le=beacon_check.U32_MAX)]


class _Entry(msgspec.Struct, forbid_unknown_fields=True):
    trace_id: Annotated[str, Meta(pattern=r"^[0-9a-f]{32}\Z")]
    span_id: Annotated[str, Meta(pattern=r"^[0-9a-f]{16}\Z")]
    kind: Literal["fetch", "xhr", "eventsource", "websocket", "navigation"]
    start_ms: _Ms
    sampled: bool = _N
    seq: _U32 = _N
    method: Annotated[str, Meta(pattern=r"^[A-Z]{1,16}\Z")] = _N
    url: Annotated[str, Meta(max_length=2048)] = _N
    status: Annotated[int, Meta(ge=0, le=999)] = _N
    request_start_ms: _Ms = _N
    response_start_ms: _Ms = _N
    response_end_ms: _Ms = _N
    dns_ms: _Ms = _N
    connect_ms: _Ms = _N
    tls_ms: _Ms = _N
    first_chunk_ms: _Ms = _N
    chunk_ms: Annotated[list[_Ms], Meta(max_length=256)] = _N
    chunks: _U32 = _N
    rendered_ms: _Ms = _N
    coarse: bool = _N
    chunks_coarse: bool = _N
    hidden: bool = _N
    transfer_size: Annotated[int, Meta(ge=0, le=beacon_check.SAFE_INT)] = _N
    protocol: Annotated[str, Meta(max_length=16)] = _N
    server_timing: list[Any] = _N  # checked by beacon_check.timings_ok (one rule, one place)
    error: Annotated[str, Meta(max_length=64)] = _N


class Beacon(msgspec.Struct, forbid_unknown_fields=True):
    """A beacon that is certainly valid against the v1 schema."""

    v: Literal[1]
    site: Annotated[str, Meta(pattern=r"^[A-Za-z0-9._-]{1,64}\Z")]
    session: Annotated[str, Meta(pattern=r"^[A-Za-z0-9_-]{8,64}\Z")]
    time_origin: Annotated[float, Meta(ge=0)]
    entries: Annotated[list[_Entry], Meta(max_length=500)]
    page: Annotated[str, Meta(max_length=2048)] = _N
    clock_drift_ms: float = _N
    sent_ms: Annotated[float, Meta(ge=0)] = _N
    dropped: _U32 = _N
    sdk: Annotated[str, Meta(max_length=64)] = _N


_decode_typed = msgspec.json.Decoder(Beacon).decode


def read(body: bytes) -> Beacon | dict[str, Any]:
    """The body as a typed, valid Beacon when it is plainly one, else as load() gives it
    (a dict, not yet validated; a malformed body or another version raises BadRequestError).
    parse() takes either."""
    try:
        b = _decode_typed(body)
    except msgspec.DecodeError:  # also ValidationError: the dict path says what is wrong
        return load(body)
    for e in b.entries:
        if e.server_timing is not None and not beacon_check.timings_ok(e.server_timing):
            return load(body)
    return b


def site_of(doc: Beacon | dict[str, Any]) -> Any:
    return doc.site if isinstance(doc, Beacon) else doc.get("site")


def _no_constants(name: str) -> Any:
    # Python's json accepts NaN and Infinity; JSON does not, and no time can be either.
    raise ValueError(f"{name} is not valid JSON")


def load(body: bytes) -> dict[str, Any]:
    try:
        # orjson: a third of json.loads' CPU. It refuses a little that json accepts
        # (integers beyond 64 bits, lone surrogates) and answers errors in its own words, so
        # whatever it refuses goes through json as before: same documents, same messages.
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        doc = _load_std(body)
    if not isinstance(doc, dict):
        raise BadRequestError("beacon must be a JSON object")
    if doc.get("v") != beacon.VERSION:
        raise BadRequestError(f"unknown beacon version {doc.get('v')!r} (this collector reads v1)")
    return doc


def _load_std(body: bytes) -> Any:
    try:
        return json.loads(body, parse_constant=_no_constants)
    except (ValueError, UnicodeDecodeError) as e:
        raise BadRequestError(f"malformed JSON: {e}") from None


def parse(doc: Beacon | dict[str, Any], received_ns: int, oldest_ns: int, now_ns: int) -> Parsed:
    """Rows for browser_entries (column order of schema.ENTRY_COLUMNS)."""
    if isinstance(doc, Beacon):
        return _parse_typed(doc, received_ns, oldest_ns, now_ns)
    bad_entries: dict[int, str] = {}
    # The hand-written check answers "valid?" (what the schema answers, tested); the
    # contract's own beacon.errors() then names what is wrong, only for bodies that need it.
    valid = beacon_check.is_valid(doc)
    errors = [] if valid else beacon.errors(doc)
    for err in errors:
        m = _ENTRY_ERR.match(err)
        if m is None:
            raise BadRequestError(f"invalid beacon: {err}"[:300])
        bad_entries.setdefault(int(m.group(1)), "schema")
    out = Parsed()
    origin = float(doc["time_origin"])
    received_ms = received_ns // 1_000_000
    drift = doc.get("clock_drift_ms")
    # The page's monotonic clock drifts from the wall clock across sleep/resume; the probe
    # says by how much (wall = time_origin + t + drift). time_origin_ms and the relative times
    # are kept as sent; the absolute entry time is the wall-clock one.
    wall = origin + (float(drift) if isinstance(drift, int | float) else 0.0)
    site, session, page = str(doc["site"]), str(doc["session"]), str(doc.get("page") or "")
    sdk = str(doc.get("sdk") or "")
    drift_f = _f(drift)
    oldest_ms, newest_ms = oldest_ns / 1e6, (now_ns + FUTURE_SLACK_NS) / 1e6
    for i, e in enumerate(doc["entries"]):
        reason = bad_entries.get(i)  # (a schema-failing entry may not even be an object)
        if reason is None:
            g = e.get
            if not valid:  # only the schema's patterns judged the ids (see _check)
                if not is_valid_trace_id(e["trace_id"]):
                    reason = "invalid_trace_id"
                elif not is_valid_span_id(e["span_id"]):
                    reason = "invalid_span_id"
            reason = reason or _check(
                e["trace_id"],
                e["span_id"],
                e["start_ms"],
                g("request_start_ms"),
                g("response_start_ms"),
                g("response_end_ms"),
                g("first_chunk_ms"),
                g("rendered_ms"),
                g("chunk_ms"),
                wall,
                oldest_ms,
                newest_ms,
            )
        if reason:
            out.rejected[reason] += 1
            continue
        # The entry passed the schema: strings are str, times int or float.
        chunk_ms = g("chunk_ms")
        out.rows.append(
            _row(
                wall,
                received_ms,
                site,
                session,
                page,
                origin,
                drift_f,
                sdk,
                e["trace_id"],
                e["span_id"],
                e["kind"],
                g("seq"),
                g("method"),
                g("url"),
                g("status"),
                float(e["start_ms"]),
                _f(g("request_start_ms")),
                _f(g("response_start_ms")),
                _f(g("response_end_ms")),
                _f(g("dns_ms")),
                _f(g("connect_ms")),
                _f(g("tls_ms")),
                _f(g("first_chunk_ms")),
                list(map(float, chunk_ms)) if chunk_ms else [],
                g("chunks"),
                _f(g("rendered_ms")),
                g("coarse"),
                g("chunks_coarse"),
                g("hidden"),
                g("transfer_size"),
                g("protocol"),
                g("server_timing"),
                g("error"),
            )
        )
        out.trace_ids.append(e["trace_id"])
    return out


def _parse_typed(b: Beacon, received_ns: int, oldest_ns: int, now_ns: int) -> Parsed:
    """parse() of a Beacon: every value already has its schema type (times are floats)."""
    out = Parsed()
    origin = b.time_origin
    received_ms = received_ns // 1_000_000
    drift = b.clock_drift_ms
    wall = origin + (drift if drift is not None else 0.0)
    site, session, page, sdk = b.site, b.session, b.page or "", b.sdk or ""
    oldest_ms, newest_ms = oldest_ns / 1e6, (now_ns + FUTURE_SLACK_NS) / 1e6
    for e in b.entries:
        t0, t3, t_end, t_first, t_rend = (
            e.request_start_ms,
            e.response_start_ms,
            e.response_end_ms,
            e.first_chunk_ms,
            e.rendered_ms,
        )
        # The patterns matched in full, so only the all-zero ids are left to refuse.
        reason = _check(
            e.trace_id,
            e.span_id,
            e.start_ms,
            t0,
            t3,
            t_end,
            t_first,
            t_rend,
            e.chunk_ms,
            wall,
            oldest_ms,
            newest_ms,
        )
        if reason:
            out.rejected[reason] += 1
            continue
        out.rows.append(
            _row(
                wall,
                received_ms,
                site,
                session,
                page,
                origin,
                drift,
                sdk,
                e.trace_id,
                e.span_id,
                e.kind,
                e.seq,
                e.method,
                e.url,
                e.status,
                e.start_ms,
                t0,
                t3,
                t_end,
                e.dns_ms,
                e.connect_ms,
                e.tls_ms,
                t_first,
                e.chunk_ms or [],
                e.chunks,
                t_rend,
                e.coarse,
                e.chunks_coarse,
                e.hidden,
                e.transfer_size,
                e.protocol,
                e.server_timing,
                e.error,
            )
        )
        out.trace_ids.append(e.trace_id)
    return out


def _row(
    wall: float,
    received_ms: int,
    site: str,
    session: str,
    page: str,
    origin: float,
    drift: float | None,
    sdk: str,
    trace_id: str,
    span_id: str,
    kind: str,
    seq: int | None,
    method: str | None,
    url: str | None,
    status: int | None,
    start: float,
    t0: float | None,
    t3: float | None,
    t_end: float | None,
    dns: float | None,
    conn: float | None,
    tls: float | None,
    t_first: float | None,
    chunk_ms: list[float],
    chunks: int | None,
    t_rend: float | None,
    coarse: bool | None,
    chunks_coarse: bool | None,
    hidden: bool | None,
    transfer_size: int | None,
    protocol: str | None,
    server_timing: list[Any] | None,
    error: str | None,
) -> tuple[Any, ...]:
    """One browser_entries row (the one place its column order is written)."""
    url = url or ""
    return (
        round((wall + start) * 1000),  # DateTime64(6): µs ticks
        received_ms,
        site,
        session,
        page,
        trace_id,
        span_id,
        kind,
        int(seq) if seq else 0,
        method or "",
        url,
        _route_of_url(url) if url else "",
        status,
        origin,
        start,
        t0,
        t3,
        t_end,
        dns,
        conn,
        tls,
        t_first,
        chunk_ms,
        chunks,
        t_rend,
        coarse is True,
        chunks_coarse is True,
        hidden is True,
        transfer_size,
        protocol or "",
        json.dumps(server_timing, separators=(",", ":")) if server_timing else "",
        error or "",
        drift,
        sdk,
    )


@lru_cache(maxsize=8192)
def _route_of_url(url: str) -> str:
    return route_template(urlparse(url).path or "/")


def _f(x: Any) -> float | None:
    return None if x is None else float(x)


_ZERO_TRACE, _ZERO_SPAN = "0" * 32, "0" * 16


def _check(
    trace_id: str,
    span_id: str,
    start: float,
    t0: float | None,
    t3: float | None,
    t_end: float | None,
    t_first: float | None,
    t_rend: float | None,
    chunks: list[float] | None,
    origin: float,
    oldest_ms: float,
    newest_ms: float,
) -> str:
    """'' for a good entry, else the reject reason (one word). The ids are lowercase hex of
    their length here (the typed decoder's patterns or the hand-written check matched them
    in full; where only the JSON Schema judged, whose `$` lets a trailing newline through,
    parse() checked them first): only the all-zero ids are left to refuse."""
    if trace_id == _ZERO_TRACE:
        return "invalid_trace_id"
    if span_id == _ZERO_SPAN:
        return "invalid_span_id"
    if t0 is not None and t0 - start > _MAX_DURATION_MS:
        return "duration_over_24h"
    lo = start if t0 is None else t0
    for v in (t3, t_end, t_first, t_rend):  # in this order: the first problem is the reason
        if v is not None:
            if v < lo:
                return "negative_duration"
            if v - start > _MAX_DURATION_MS:
                return "duration_over_24h"
    if chunks:
        if chunks != sorted(chunks):  # a chunk before the one it follows (no NaN in JSON)
            return "negative_duration"
        if chunks[-1] - start > _MAX_DURATION_MS:
            return "duration_over_24h"
    abs_ms = origin + start
    if abs_ms < oldest_ms:
        return "older_than_retention"
    if abs_ms > newest_ms:
        return "in_future"
    return ""
