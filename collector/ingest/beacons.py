"""Browser beacons (v1, v2) → ``browser_entries`` rows (v2's ``llm`` in the LLM columns).

A valid beacon is what the Structs of parallax_contracts.beacon say, and nothing else: the
body of a plain beacon is decoded by them in one pass (``read`` → ``Beacon``); any other
body is parsed as JSON (``load``) and checked by the same Structs, the envelope first (an
error there, or an unknown version, rejects the body with 400), then each entry alone (an
invalid entry is rejected and counted, the others are kept). Both give ``parse`` the same
typed entries; the checks here are the ones beyond the contract's types (ids not all zero,
times in order, within retention), which decide the per-entry reject reasons.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from functools import lru_cache
from typing import Any
from urllib.parse import urlparse

import msgspec
import orjson

from collector.ingest.common import FUTURE_SLACK_NS, MAX_DURATION_NS, BadRequestError, Parsed
from parallax_contracts import beacon
from parallax_contracts.beacon import Beacon, Entry, Llm, ServerTiming
from parallax_contracts.routes import route_template

_MAX_DURATION_MS = MAX_DURATION_NS / 1e6
_TOO_DEEP = "malformed JSON: nested too deep"


def read(body: bytes) -> Beacon[Entry] | dict[str, Any]:
    """The body as a whole valid Beacon when it is plainly one (≈ 1.7 µs per entry), else as
    load() gives it (a dict, not yet checked; a malformed body or another version raises
    BadRequestError). parse() takes either."""
    try:
        return beacon.decode(body)
    except msgspec.DecodeError:  # also ValidationError: parse() checks it entry by entry
        return load(body)
    except RecursionError:  # msgspec's own depth limit: no beacon nests beyond 4 levels
        raise BadRequestError(_TOO_DEEP) from None


def site_of(doc: Beacon[Entry] | dict[str, Any]) -> Any:
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
    if doc.get("v") not in beacon.VERSIONS:
        v = doc.get("v")
        raise BadRequestError(f"unknown beacon version {v!r} (this collector reads v1, v2)")
    return doc


def _load_std(body: bytes) -> Any:
    try:
        return json.loads(body, parse_constant=_no_constants)
    except (ValueError, UnicodeDecodeError) as e:
        raise BadRequestError(f"malformed JSON: {e}") from None
    except RecursionError:  # json's C scanner stops at the interpreter's recursion limit
        raise BadRequestError(_TOO_DEEP) from None


def parse(
    doc: Beacon[Entry] | dict[str, Any], received_ns: int, oldest_ns: int, now_ns: int
) -> Parsed:
    """Rows for browser_entries (column order of schema.ENTRY_COLUMNS)."""
    if isinstance(doc, Beacon):
        return _parse(doc, doc.entries, received_ns, oldest_ns, now_ns)
    try:
        env, checked = beacon.convert(doc)
    except msgspec.ValidationError as e:
        raise BadRequestError(f"invalid beacon: {e}"[:300]) from None
    entries = [
        c if type(c) is Entry else _invalid_reason(raw)
        for raw, c in zip(env.entries, checked, strict=True)
    ]
    return _parse(env, entries, received_ns, oldest_ns, now_ns)


def _invalid_reason(raw: Any) -> str:
    """Why an entry the Structs refused is rejected: "schema", unless its only fault is a
    newline after its trace or span id. That one counts under the id's reason, as before the
    Structs judged entries: the JSON Schema validator used then (Python's re, whose `$`
    matches before a final newline) let it through to the id check."""
    if type(raw) is not dict:
        return "schema"
    fixed = dict(raw)
    for k in ("span_id", "trace_id"):
        v = raw.get(k)
        if type(v) is str and v.endswith("\n"):
            fixed[k] = v[:-1]
    if fixed == raw or type(beacon.check_entry(fixed)) is not Entry:
        return "schema"
    return "invalid_trace_id" if fixed["trace_id"] != raw["trace_id"] else "invalid_span_id"


def _parse(
    b: Beacon[Any],
    entries: Sequence[Entry | str],
    received_ns: int,
    oldest_ns: int,
    now_ns: int,
) -> Parsed:
    """Rows of a checked beacon: ``entries`` are its valid entries, or for an invalid one the
    reason to count it under."""
    out = Parsed()
    origin, drift = b.time_origin, b.clock_drift_ms
    # The page's monotonic clock drifts from the wall clock across sleep/resume; the probe
    # says by how much (wall = time_origin + t + drift). time_origin_ms and the relative times
    # are kept as sent; the absolute entry time is the wall-clock one.
    wall = origin + (drift if drift is not None else 0.0)
    # the row's columns from the envelope: those after the time, those after the error
    head, tail = (received_ns // 1_000_000, b.site, b.session, b.page or ""), (drift, b.sdk or "")
    oldest_ms, newest_ms = oldest_ns / 1e6, (now_ns + FUTURE_SLACK_NS) / 1e6
    rows, trace_ids, rejected = out.rows, out.trace_ids, out.rejected
    for e in entries:
        if isinstance(e, str):
            rejected[e] += 1
            continue
        reason = _check(e, wall, oldest_ms, newest_ms)
        if reason:
            rejected[reason] += 1
            continue
        rows.append(_entry_row(e, wall, head, origin, tail))
        trace_ids.append(e.trace_id)
    return out


def _entry_row(
    e: Entry,
    wall: float,
    head: tuple[int, str, str, str],
    origin: float,
    tail: tuple[float | None, str],
) -> tuple[Any, ...]:
    """A checked entry's row, the one place a row's order is (schema.ENTRY_COLUMNS'), with
    the envelope's columns: ``head`` (received_ms, site, session, page), ``origin``
    (time_origin_ms), ``tail`` (clock_drift_ms, sdk)."""
    url, seq, st, start = e.url or "", e.seq, e.server_timing, e.start_ms
    return (
        round((wall + start) * 1000),  # DateTime64(6): µs ticks
        *head,
        e.trace_id,
        e.span_id,
        e.kind,
        seq if seq else 0,
        e.method or "",
        url,
        _route_of_url(url) if url else "",
        e.status,
        origin,
        start,
        e.request_start_ms,
        e.response_start_ms,
        e.response_end_ms,
        e.dns_ms,
        e.connect_ms,
        e.tls_ms,
        e.first_chunk_ms,
        e.chunk_ms or [],
        e.chunks,
        e.rendered_ms,
        e.coarse is True,
        e.chunks_coarse is True,
        e.hidden is True,
        e.transfer_size,
        e.protocol or "",
        _timings_json(st) if st else "",
        e.error or "",
        *tail,
        *(_NO_LLM if e.llm is None else _llm_columns(e.llm)),
    )


# The LLM columns of an entry without an llm object (schema.ENTRY_LLM_COLUMNS' order):
# absent, never 0.
_NO_LLM: tuple[Any, ...] = ("", None, None, [], [], None, "", "", None)


def _llm_columns(llm: Llm) -> tuple[Any, ...]:
    """What the probe read of an LLM stream, in schema.ENTRY_LLM_COLUMNS' order."""
    return (
        llm.dialect,
        llm.first_token_ms,
        llm.first_output_ms,
        llm.token_ms or [],
        llm.gap_hist or [],
        llm.tokens,
        llm.tokens_source,
        llm.end or "",
        llm.bad_events,
    )


def _check_llm(llm: Llm, start: float, t0: float | None) -> str:
    """The entry's check for its llm object's times, as for its chunks: none before the
    request, in order, within a day of it ('' when good)."""
    lo = start if t0 is None else t0
    for v in (llm.first_output_ms, llm.first_token_ms):
        if v is not None:
            if v < lo:
                return "negative_duration"
            if v - start > _MAX_DURATION_MS:
                return "duration_over_24h"
    ts = llm.token_ms
    if ts:
        if ts[0] < lo or ts != sorted(ts):
            return "negative_duration"
        if ts[-1] - start > _MAX_DURATION_MS:
            return "duration_over_24h"
    return ""


def _timings_json(timings: list[ServerTiming]) -> str:
    # json.dumps, not msgspec: it escapes what is not ASCII, lone surrogates included, which
    # the JSON fallback of load() lets through and a UTF-8 encoder would refuse.
    return json.dumps(msgspec.to_builtins(timings), separators=(",", ":"))


@lru_cache(maxsize=8192)
def _route_of_url(url: str) -> str:
    return route_template(urlparse(url).path or "/")


_ZERO_TRACE, _ZERO_SPAN = "0" * 32, "0" * 16


def _check(e: Entry, origin: float, oldest_ms: float, newest_ms: float) -> str:
    """'' for a good entry, else the reject reason (one word). The ids are lowercase hex of
    their length here (the Structs' patterns matched them in full): only the all-zero ids
    are left to refuse; the llm object's times last. ``origin``: the page's wall-clock time
    origin."""
    if e.trace_id == _ZERO_TRACE:
        return "invalid_trace_id"
    if e.span_id == _ZERO_SPAN:
        return "invalid_span_id"
    start, t0, chunks = e.start_ms, e.request_start_ms, e.chunk_ms
    if t0 is not None and t0 - start > _MAX_DURATION_MS:
        return "duration_over_24h"
    lo = start if t0 is None else t0
    # in this order: the first problem is the reason
    for v in (e.response_start_ms, e.response_end_ms, e.first_chunk_ms, e.rendered_ms):
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
    return "" if e.llm is None else _check_llm(e.llm, start, t0)
