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
from typing import Any
from urllib.parse import urlparse

import orjson

from collector.ingest import beacon_check
from collector.ingest.common import FUTURE_SLACK_NS, MAX_DURATION_NS, BadRequestError, Parsed
from parallax_contracts import beacon
from parallax_contracts.routes import route_template
from parallax_contracts.trace_context import is_valid_span_id, is_valid_trace_id

_ENTRY_ERR = re.compile(r"^entries/(\d+)(/|:)")
_MAX_DURATION_MS = MAX_DURATION_NS / 1e6
_TIMES = (
    "request_start_ms",
    "response_start_ms",
    "response_end_ms",
    "first_chunk_ms",
    "rendered_ms",
)


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


def parse(doc: dict[str, Any], received_ns: int, oldest_ns: int, now_ns: int) -> Parsed:
    """Rows for browser_entries (column order of schema.ENTRY_COLUMNS)."""
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
    rows_append = out.rows.append
    oldest_ms, newest_ms = oldest_ns / 1e6, (now_ns + FUTURE_SLACK_NS) / 1e6
    for i, e in enumerate(doc["entries"]):
        reason = bad_entries.get(i) or _check(e, wall, oldest_ms, newest_ms, valid)
        if reason:
            out.rejected[reason] += 1
            continue
        # The entry passed the schema: strings are str, times int or float (hot path: no
        # calls where a value only needs a default; the float() calls stay, the columns
        # and the pairing arithmetic want floats).
        g = e.get
        start = float(e["start_ms"])
        url = g("url") or ""
        chunk_ms = list(map(float, g("chunk_ms") or ()))
        st = g("server_timing")
        t0, t3, t_end, dns, conn, tls, t_first, t_rend = (
            g("request_start_ms"),
            g("response_start_ms"),
            g("response_end_ms"),
            g("dns_ms"),
            g("connect_ms"),
            g("tls_ms"),
            g("first_chunk_ms"),
            g("rendered_ms"),
        )
        seq = g("seq")
        rows_append(
            (
                round((wall + start) * 1000),  # DateTime64(6): µs ticks
                received_ms,
                site,
                session,
                page,
                e["trace_id"],
                e["span_id"],
                e["kind"],
                int(seq) if seq else 0,
                g("method") or "",
                url,
                _route_of_url(url) if url else "",
                g("status"),
                origin,
                start,
                None if t0 is None else float(t0),
                None if t3 is None else float(t3),
                None if t_end is None else float(t_end),
                None if dns is None else float(dns),
                None if conn is None else float(conn),
                None if tls is None else float(tls),
                None if t_first is None else float(t_first),
                chunk_ms,
                g("chunks"),
                None if t_rend is None else float(t_rend),
                g("coarse") is True,
                g("chunks_coarse") is True,
                g("hidden") is True,
                g("transfer_size"),
                g("protocol") or "",
                json.dumps(st, separators=(",", ":")) if st else "",
                g("error") or "",
                drift_f,
                sdk,
            )
        )
        out.trace_ids.append(e["trace_id"])
    return out


@lru_cache(maxsize=8192)
def _route_of_url(url: str) -> str:
    return route_template(urlparse(url).path or "/")


def _f(x: Any) -> float | None:
    return None if x is None else float(x)


_ZERO_TRACE, _ZERO_SPAN = "0" * 32, "0" * 16


def _check(
    e: dict[str, Any], origin: float, oldest_ms: float, newest_ms: float, ids_matched: bool
) -> str:
    """'' for a good entry, else the reject reason (one word). ``ids_matched``: the
    hand-written check passed the whole beacon, so both ids are exactly lowercase hex of
    their length (its fullmatch); only the all-zero ids are left to refuse. Otherwise the
    JSON Schema's patterns (a ``$`` that lets a trailing newline through) were all that
    ran, and the ids are checked in full."""
    if ids_matched:
        if e["trace_id"] == _ZERO_TRACE:
            return "invalid_trace_id"
        if e["span_id"] == _ZERO_SPAN:
            return "invalid_span_id"
    else:
        if not is_valid_trace_id(e["trace_id"]):
            return "invalid_trace_id"
        if not is_valid_span_id(e["span_id"]):
            return "invalid_span_id"
    start = float(e["start_ms"])
    t0 = e.get("request_start_ms", start)
    for k in _TIMES:
        v = e.get(k)
        if v is None:
            continue
        if v < t0 and k != "request_start_ms":
            return "negative_duration"
        if v - start > _MAX_DURATION_MS:
            return "duration_over_24h"
    chunks = e.get("chunk_ms") or []
    if chunks != sorted(chunks):  # a chunk before the one it follows (no NaN in JSON)
        return "negative_duration"
    if chunks and chunks[-1] - start > _MAX_DURATION_MS:
        return "duration_over_24h"
    abs_ms = origin + start
    if abs_ms < oldest_ms:
        return "older_than_retention"
    if abs_ms > newest_ms:
        return "in_future"
    return ""
