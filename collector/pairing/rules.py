"""Pairing one browser entry with its server hop(s), and the derived parts: pure functions.

Rules (docs/collector.md):
- the server spans of an entry are those whose parent is the browser span (same trace);
  a WebSocket exchange (``seq`` > 0) pairs by trace id and sequence number instead;
- an SDK span that duplicates an agent span of the same hop (same host, same port or one
  unknown, overlapping in time) is folded into it: the agent's is kept, the other linked;
- spans of one browser span that do not overlap in time are separate connections
  (EventSource reconnects): the first is paired, the rest counted;
- the remaining spans, ordered by arrival, are the hops: edge first, origin last.

Spans and entries are dicts as the store returns them, with instants as integers:
``time_ns``/``end_ns``/``arrival_ns`` for spans, ``time_origin_ms`` + relative ms for entries;
the one-hop fast path (``pair_tuple_one_hop``) reads the row tuples as written instead.
``pairs_for`` and ``pairs_for_rows`` apply the rules to the traces of one pairing round.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from typing import Any

from collector.pairing import llm
from collector.store import schema
from collector.store.llm_columns import ENTRY_LLM_COLUMNS
from parallax_contracts import genai
from parallax_contracts import span_attributes as sa
from parallax_contracts.span_attributes import SOURCE_EBPF

Span = dict[str, Any]
Entry = dict[str, Any]


def _overlap(a: Span, b: Span) -> bool:
    return bool(a["time_ns"] <= b["end_ns"] and b["time_ns"] <= a["end_ns"])


def _same_hop(agent: Span, other: Span) -> bool:
    if agent["host"] and other["host"] and agent["host"] != other["host"]:
        return False
    pa, po = agent["server_port"], other["server_port"]
    return (not pa or not po or pa == po) and _overlap(agent, other)


def candidates(entry: Entry, spans: Sequence[Span]) -> list[Span]:
    """The server spans that belong to this browser entry (same trace id assumed)."""
    seq = entry.get("seq") or 0
    if entry.get("kind") == "websocket" and seq > 0:
        return [s for s in spans if s["ws_seq"] == seq]
    return [s for s in spans if s["parent_span_id"] == entry["span_id"] and s["ws_seq"] == seq]


def arrange(spans: Sequence[Span]) -> tuple[list[Span], list[str], int]:
    """(hops in arrival order, linked SDK span ids, reconnects)."""
    if len(spans) == 1:  # the common case: one hop, nothing to fold or order
        return [spans[0]], [], 0
    uniq = list({s["span_id"]: s for s in spans}.values())  # a retried span may be read twice
    agents = [s for s in uniq if s["source"] == SOURCE_EBPF]
    kept: list[Span] = []
    dup_of: dict[str, Span] = {}
    for s in uniq:
        twin = None
        if s["source"] != SOURCE_EBPF:
            twin = next((a for a in agents if _same_hop(a, s)), None)
        if twin is not None:
            dup_of[s["span_id"]] = twin
        else:
            kept.append(s)
    kept.sort(key=lambda s: (s["time_ns"], s["span_id"]))
    attempts: list[list[Span]] = []
    end = -1
    for s in kept:
        if not attempts or s["time_ns"] > end:
            attempts.append([s])
            end = s["end_ns"]
        else:
            attempts[-1].append(s)
            end = max(end, s["end_ns"])
    if not attempts:
        return [], [], 0
    first = sorted(attempts[0], key=lambda s: (_arrival(s), s["time_ns"], s["span_id"]))
    first_ids = {s["span_id"] for s in first}
    # Links point at the paired connection's hops only.
    linked = sorted(i for i, twin in dup_of.items() if twin["span_id"] in first_ids)
    return first, linked, len(attempts) - 1


def _arrival(s: Span) -> int:
    """t_arr, or t1 (span start) for a span without the agent's arrival time."""
    a = s.get("arrival_ns")
    return int(a) if a else int(s["time_ns"])


def _ttfb_us(s: Span) -> float:
    """t2 − t1: the agent's value, else the span's duration (an SDK span's stand-in)."""
    v = s.get("ttfb_us")
    return float(v) if v is not None else float(s["duration_us"])


def _t2_ns(s: Span) -> float:
    return float(s["time_ns"]) + _ttfb_us(s) * 1000.0


def _gaps(xs: Sequence[float], scale: float = 1.0) -> list[float]:
    return [(b - a) * scale for a, b in itertools.pairwise(xs)]


def _sub(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


_HOLD_MAX, _HOLD_REASON = sa.WIRE_HOLD_MAX_US.name, sa.WIRE_HOLD_REASON.name


def hold_of(span: Span | None, attrs: dict[str, Any] | None) -> tuple[float | None, str]:
    """(longest write-to-wire hold in ms, its reason) of a span: from the store's columns
    (``span``, read back) or from its attributes as the ingest wrote them (``attrs``);
    (None, '') where not measured."""
    if span is not None and "wire_hold_max_us" in span:
        v, why = span["wire_hold_max_us"], span.get("wire_hold_reason") or ""
    else:
        raw = (attrs or {}).get(_HOLD_MAX)
        try:
            v = int(raw) if raw is not None and raw != "" else None
        except ValueError:
            v = None
        why = str((attrs or {}).get(_HOLD_REASON) or "")
    if v is None or v < 0:
        return None, ""
    return v / 1000.0, why


def _painted_after(first_chunk: float | None, first_token: float | None) -> float | None:
    """What the probe's paint follows: on an LLM stream the first answer token (the role-only
    delta or ``message_start`` shows nothing), else the first chunk (docs/probe.md)."""
    return first_chunk if first_token is None else first_token


def derive(entry: Entry, hops: Sequence[Span]) -> dict[str, Any]:
    """The derived parts of one exchange (all ms; None where not measurable), its LLM
    stream's included (collector/pairing/llm.py)."""
    t0, t3 = entry.get("request_start_ms"), entry.get("response_start_ms")
    first, rendered = entry.get("first_chunk_ms"), entry.get("rendered_ms")
    user_ttfb = _sub(t3, t0)
    shown = _painted_after(first, entry.get("llm_first_token_ms"))
    out: dict[str, Any] = {
        "user_ttfb_ms": user_ttfb,
        "user_ttft_ms": _sub(first, t0),
        "user_visible_ttft_ms": _sub(rendered, t0),
        "user_duration_ms": _sub(entry.get("response_end_ms"), t0),
        "user_itl_ms": _gaps(entry.get("chunk_ms") or []),
        "render_delay_ms": _sub(rendered, shown),
        **llm.pair_dict(entry, hops[-1] if hops else None),
    }
    if not hops:
        return out
    edge, origin = hops[0], hops[-1]
    out["wire_hold_ms"], out["wire_hold_reason"] = hold_of(origin, origin.get("attributes"))
    o_ttft = origin.get("ttft_us")
    out.update(
        server_ttfb_ms=_ttfb_us(origin) / 1000.0,
        server_ttft_ms=None if o_ttft is None else o_ttft / 1000.0,
        server_duration_ms=float(origin["duration_us"]) / 1000.0,
        server_itl_ms=_gaps(origin.get("chunk_offsets_us") or [], 1e-3),
        server_timed=origin.get("ttfb_us") is not None,
        edge_itl_ms=_gaps(edge.get("chunk_offsets_us") or [], 1e-3),
    )
    # Time each hop adds: its (t2 − t_arr) minus the next hop's; the origin's whole.
    spans_ms = [(_t2_ns(h) - _arrival(h)) / 1e6 for h in hops]
    out["hop_added_ms"] = [
        spans_ms[i] - spans_ms[i + 1] if i + 1 < len(hops) else spans_ms[i]
        for i in range(len(hops))
    ]
    o_arr = origin.get("arrival_ns")
    queue = (origin["time_ns"] - o_arr) / 1e6 if o_arr else None
    rq = origin.get("recv_queue_us")
    recv = None if rq is None else rq / 1000.0
    out["queue_ms"] = queue
    out["recv_queue_ms"] = recv
    out["accept_queue_ms"] = None if queue is None or recv is None else max(0.0, queue - recv)
    network = None if user_ttfb is None else user_ttfb - spans_ms[0]
    out["network_ms"] = network
    out["retransmits"] = edge.get("retransmits")
    srtt = edge.get("srtt_us")
    out["srtt_ms"] = None if srtt is None else srtt / 1000.0
    theta = None
    if t0 is not None and t3 is not None:
        # the browser's wall clock at t0/t3: time origin + relative time + its reported drift
        origin_ms = float(entry["time_origin_ms"]) + float(entry.get("clock_drift_ms") or 0.0)
        t_arr_ms = _arrival(edge) / 1e6
        t2_ms = _t2_ns(edge) / 1e6
        theta = ((t_arr_ms - (origin_ms + t0)) + (t2_ms - (origin_ms + t3))) / 2.0
    out["theta_ms"] = theta
    out["theta_delay_ms"] = network if theta is not None else None
    return out


def pair_row(
    entry: Entry, spans: Sequence[Span], version_ns: int | None = None
) -> dict[str, Any] | None:
    """The ``pairs`` row for ``entry`` (keys = schema.PAIR_COLUMNS), or None if no span."""
    cands = candidates(entry, spans)
    hops, linked, reconnects = arrange(cands)
    if not hops:
        return None
    d = derive(entry, hops)
    origin = hops[-1]
    now = version_ns or time.time_ns()
    status = origin.get("status") or entry.get("status") or 0
    return {
        "time": entry["time_us"],
        "version": now,
        "paired_at": now // 1_000_000,
        "site": entry["site"],
        "session": entry["session"],
        "service": origin["service"],
        "route": origin["route"] or entry.get("route") or "",
        "method": origin["method"] or entry.get("method") or "",
        "status": int(status),
        "kind": entry["kind"],
        "trace_id": entry["trace_id"],
        "span_id": entry["span_id"],
        "seq": entry.get("seq") or 0,
        "coarse": bool(entry.get("coarse")),
        "chunks_coarse": bool(entry.get("chunks_coarse")),
        "hops": len(hops),
        "hop_span_ids": [h["span_id"] for h in hops],
        "hop_services": [h["service"] for h in hops],
        "linked_span_ids": linked,
        "reconnects": reconnects,
        **d,
        # Every hop decides on the trace id's randomness (consistent sampling): the pair
        # exists when any of its spans was kept, i.e. under the lowest threshold among them.
        "sample_th": min(int(c.get("sample_th") or 0) for c in cands),
    }


# --- the fast path: one entry, one span, both as the row tuples the ingest wrote ----------
# Most exchanges have one hop. Pairing them from the tuples (column order of
# schema.SPAN_COLUMNS / ENTRY_COLUMNS) straight into a pairs tuple (PAIR_COLUMNS order) skips
# three dicts per pair; the values are the ones pair_row computes (tests/collector check
# both paths give identical rows), and every other case goes through pair_row.
_SN = {n: i for i, n in enumerate(schema.column_names(schema.SPAN_COLUMNS))}
_EN = {n: i for i, n in enumerate(schema.column_names(schema.ENTRY_COLUMNS))}
PAIR_NAMES = schema.column_names(schema.PAIR_COLUMNS)
S_TIME, S_END, S_TRACE, S_SPAN, S_PARENT = (
    _SN[n] for n in ("time", "end_time", "trace_id", "span_id", "parent_span_id")
)
S_SERVICE, S_METHOD, S_ROUTE, S_STATUS, S_ARRIVAL = (
    _SN[n] for n in ("service", "method", "route", "status", "arrival")
)
S_TTFB, S_RECVQ, S_TTFT, S_DUR, S_OFFSETS = (
    _SN[n] for n in ("ttfb_us", "recv_queue_us", "ttft_us", "duration_us", "chunk_offsets_us")
)
S_SRTT, S_RETRANS, S_WS_SEQ, S_SAMPLE_TH, S_ATTRS = (
    _SN[n] for n in ("srtt_us", "retransmits", "ws_seq", "sample_th", "attributes")
)
E_TIME, E_SITE, E_SESSION, E_TRACE, E_SPAN, E_KIND, E_SEQ = (
    _EN[n] for n in ("time", "site", "session", "trace_id", "span_id", "kind", "seq")
)
E_METHOD, E_ROUTE, E_STATUS, E_ORIGIN = (
    _EN[n] for n in ("method", "route", "status", "time_origin_ms")
)
E_T0, E_T3, E_END, E_FIRST, E_CHUNKS, E_RENDERED = (
    _EN[n]
    for n in (
        "request_start_ms",
        "response_start_ms",
        "response_end_ms",
        "first_chunk_ms",
        "chunk_ms",
        "rendered_ms",
    )
)
E_COARSE, E_CHUNKS_COARSE, E_DRIFT = (_EN[n] for n in ("coarse", "chunks_coarse", "clock_drift_ms"))
# the entry's LLM columns, by name (collector/pairing/llm.py reads them)
E_LLM = tuple((c.name, _EN[c.name]) for c in ENTRY_LLM_COLUMNS)
E_LLM_DIALECT = _EN["llm_dialect"]
E_LLM_FIRST_TOKEN = _EN["llm_first_token_ms"]
_DIALECT = genai.DIALECT.name


def llm_tuple(e: tuple[Any, ...], s: tuple[Any, ...]) -> tuple[Any, ...]:
    """The pair's LLM columns from an entry's and its origin span's row tuples."""
    attrs = s[S_ATTRS]
    if not e[E_LLM_DIALECT] and not (attrs and _DIALECT in attrs):
        return llm.NO_LLM  # the common case: neither side read a stream dialect
    user = llm.user_stream({name: e[i] for name, i in E_LLM}) if e[E_LLM_DIALECT] else None
    server = llm.server_stream({"attributes": attrs, "ttft_us": s[S_TTFT]})
    return llm.pair_values(e[E_T0], user, server)


def candidate_rows(
    entry: tuple[Any, ...], spans: Sequence[tuple[Any, ...]]
) -> list[tuple[Any, ...]]:
    """candidates() over row tuples."""
    seq = entry[E_SEQ] or 0
    if entry[E_KIND] == "websocket" and seq > 0:
        return [s for s in spans if s[S_WS_SEQ] == seq]
    sid = entry[E_SPAN]
    return [s for s in spans if s[S_PARENT] == sid and s[S_WS_SEQ] == seq]


def pair_tuple_one_hop(e: tuple[Any, ...], s: tuple[Any, ...], version_ns: int) -> tuple[Any, ...]:
    """pair_row(entry, [span]) for an entry whose only candidate is ``s``, as a tuple in
    PAIR_COLUMNS order."""
    t0, t3, first, rendered = e[E_T0], e[E_T3], e[E_FIRST], e[E_RENDERED]
    shown = _painted_after(first, e[E_LLM_FIRST_TOKEN])
    end = e[E_END]
    user_ttfb = None if t3 is None or t0 is None else t3 - t0
    chunk_ms = e[E_CHUNKS] or []
    offsets = s[S_OFFSETS] or []
    ttfb = s[S_TTFB]
    ttfb_us = float(ttfb) if ttfb is not None else float(s[S_DUR])
    t1 = s[S_TIME]
    arr = s[S_ARRIVAL]
    arrival = int(arr) if arr else int(t1)
    t2 = float(t1) + ttfb_us * 1000.0
    span_ms = (t2 - arrival) / 1e6
    queue = (t1 - arr) / 1e6 if arr else None
    rq = s[S_RECVQ]
    recv = None if rq is None else rq / 1000.0
    network = None if user_ttfb is None else user_ttfb - span_ms
    theta = None
    if t0 is not None and t3 is not None:
        origin_ms = float(e[E_ORIGIN]) + float(e[E_DRIFT] or 0.0)
        theta = ((arrival / 1e6 - (origin_ms + t0)) + (t2 / 1e6 - (origin_ms + t3))) / 2.0
    ttft = s[S_TTFT]
    srtt = s[S_SRTT]
    server_itl = [(b - a) * 1e-3 for a, b in itertools.pairwise(offsets)]
    hold_ms, hold_why = hold_of(None, s[S_ATTRS])
    return (
        e[E_TIME],
        version_ns,
        version_ns // 1_000_000,
        e[E_SITE],
        e[E_SESSION],
        s[S_SERVICE],
        s[S_ROUTE] or e[E_ROUTE] or "",
        s[S_METHOD] or e[E_METHOD] or "",
        int(s[S_STATUS] or e[E_STATUS] or 0),
        e[E_KIND],
        e[E_TRACE],
        e[E_SPAN],
        e[E_SEQ] or 0,
        bool(e[E_COARSE]),
        bool(e[E_CHUNKS_COARSE]),
        user_ttfb,
        None if first is None or t0 is None else first - t0,
        None if rendered is None or t0 is None else rendered - t0,
        None if end is None or t0 is None else end - t0,
        [(b - a) * 1.0 for a, b in itertools.pairwise(chunk_ms)],
        None if rendered is None or shown is None else rendered - shown,
        ttfb_us / 1000.0,
        None if ttft is None else ttft / 1000.0,
        float(s[S_DUR]) / 1000.0,
        server_itl,
        ttfb is not None,
        1,
        [s[S_SPAN]],
        [s[S_SERVICE]],
        [span_ms],
        list(server_itl),
        [],
        0,
        network,
        queue,
        None if queue is None or recv is None else max(0.0, queue - recv),
        recv,
        s[S_RETRANS],
        None if srtt is None else srtt / 1000.0,
        theta,
        network if theta is not None else None,
        s[S_SAMPLE_TH],
        hold_ms,
        hold_why,
        *llm_tuple(e, s),
    )


def pair_tuple(d: dict[str, Any]) -> tuple[Any, ...]:
    """A pair_row dict as a tuple in PAIR_COLUMNS order."""
    return tuple(d[n] for n in PAIR_NAMES)


# --- The rules over many traces at once (the pairer's rounds) ----------------------------
_SPAN_NAMES = schema.column_names(schema.SPAN_COLUMNS)
_ENTRY_NAMES = schema.column_names(schema.ENTRY_COLUMNS)


def span_dict(row: tuple[Any, ...]) -> dict[str, Any]:
    """A server_spans row tuple (as written) → the dict read_traces returns."""
    d = dict(zip(_SPAN_NAMES, row, strict=True))
    d["time_ns"], d["end_ns"], d["arrival_ns"] = d["time"], d["end_time"], d["arrival"]
    return d


def entry_dict(row: tuple[Any, ...]) -> dict[str, Any]:
    d = dict(zip(_ENTRY_NAMES, row, strict=True))
    d["time_us"] = d["time"]
    return d


def pairs_for(
    spans: list[dict[str, Any]], entries: list[dict[str, Any]], version: int | None = None
) -> tuple[list[tuple[Any, ...]], set[str]]:
    """(pair rows as PAIR_COLUMNS tuples, trace ids with one side missing)."""
    by_trace: dict[str, list[dict[str, Any]]] = {}
    for s in spans:
        by_trace.setdefault(s["trace_id"], []).append(s)
    one_sided = set(by_trace)
    out = []
    version = version or time.time_ns()
    for e in entries:
        row = pair_row(e, by_trace.get(e["trace_id"], []), version)
        if row is None:
            one_sided.add(e["trace_id"])
        else:
            one_sided.discard(e["trace_id"])
            out.append(pair_tuple(row))
    return out, one_sided


Rows = list[tuple[Any, ...]]


def pairs_for_rows(
    traces: list[tuple[Rows, Rows]], version: int
) -> tuple[list[tuple[Any, ...]], set[str]]:
    """pairs_for() over the row tuples of traces that have both sides in memory (each item:
    (spans, entries) of one trace). An entry with exactly one candidate span — the common
    case — is paired straight from the tuples; anything else goes through pair_row."""
    out: list[tuple[Any, ...]] = []
    one_sided: set[str] = set()
    one_hop = pair_tuple_one_hop
    cand = candidate_rows
    for spans, entries in traces:
        paired = True
        for e in entries:
            c = cand(e, spans)
            if len(c) == 1:
                out.append(one_hop(e, c[0], version))
                paired = True
            elif not c:
                paired = False
            else:
                row = pair_row(entry_dict(e), [span_dict(s) for s in spans], version)
                assert row is not None  # several candidates make at least one hop
                out.append(pair_tuple(row))
                paired = True
        if not paired:  # as in pairs_for: the trace's last entry decides
            one_sided.add(entries[-1][E_TRACE])
    return out, one_sided
