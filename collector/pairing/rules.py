"""Pairing one browser entry with its server hop(s), and the derived parts: pure functions.

Rules (docs/collector.md):
- the server spans of an entry are those whose parent is the browser span (same trace);
  a WebSocket exchange (``seq`` > 0) pairs by trace id and sequence number instead;
- an SDK span that duplicates an agent span of the same hop (same host, same port or one
  unknown, overlapping in time) is folded into it: the agent's is kept, the other linked;
- spans of one browser span that do not overlap in time are separate connections
  (EventSource reconnects): the first is paired, the rest counted;
- the remaining spans, ordered by arrival, are the hops: edge first, origin last.

Spans and entries are the rows as the ingest writes them (collector/store/rows.py), whether
they come from the pairer's memory or are read back from the store (pairing/lookups.py);
``derive`` is the one derivation of a pair's parts: the pairer writes its rows, the query
API shows them, the SLA checker reads them from ``pairs``.
"""

from __future__ import annotations

import itertools
import operator
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from collector.pairing import llm
from collector.store.rows import EntryRow, PairRow, SpanRow
from parallax_contracts import span_attributes as sa
from parallax_contracts.compiled import load
from parallax_contracts.span_attributes import SOURCE_EBPF


def _overlap(a: SpanRow, b: SpanRow) -> bool:
    return a.time <= b.end_time and b.time <= a.end_time


def _same_hop(agent: SpanRow, other: SpanRow) -> bool:
    if agent.host and other.host and agent.host != other.host:
        return False
    pa, po = agent.server_port, other.server_port
    return (not pa or not po or pa == po) and _overlap(agent, other)


def candidates(entry: EntryRow, spans: Sequence[SpanRow]) -> list[SpanRow]:
    """The server spans that belong to this browser entry (same trace id assumed)."""
    seq = entry.seq or 0
    if entry.kind == "websocket" and seq > 0:
        return [s for s in spans if s.ws_seq == seq]
    sid = entry.span_id
    if len(spans) == 1:  # most traces: the test without a comprehension's frame (~0.2 µs)
        s = spans[0]
        return [s] if s.parent_span_id == sid and s.ws_seq == seq else []
    return [s for s in spans if s.parent_span_id == sid and s.ws_seq == seq]


def arrange(spans: Sequence[SpanRow]) -> tuple[list[SpanRow], list[str], int]:
    """(hops in arrival order, linked SDK span ids, reconnects)."""
    if len(spans) == 1:  # the common case: one hop, nothing to fold or order
        return [spans[0]], [], 0
    uniq = list({s.span_id: s for s in spans}.values())  # a retried span may be read twice
    agents = [s for s in uniq if s.source == SOURCE_EBPF]
    kept: list[SpanRow] = []
    dup_of: dict[str, SpanRow] = {}
    for s in uniq:
        twin = None
        if s.source != SOURCE_EBPF:
            twin = next((a for a in agents if _same_hop(a, s)), None)
        if twin is not None:
            dup_of[s.span_id] = twin
        else:
            kept.append(s)
    kept.sort(key=lambda s: (s.time, s.span_id))
    attempts: list[list[SpanRow]] = []
    end = -1
    for s in kept:
        if not attempts or s.time > end:
            attempts.append([s])
            end = s.end_time
        else:
            attempts[-1].append(s)
            end = max(end, s.end_time)
    if not attempts:
        return [], [], 0
    first = sorted(attempts[0], key=lambda s: (_arrival(s), s.time, s.span_id))
    first_ids = {s.span_id for s in first}
    # Links point at the paired connection's hops only.
    linked = sorted(i for i, twin in dup_of.items() if twin.span_id in first_ids)
    return first, linked, len(attempts) - 1


def _arrival(s: SpanRow) -> int:
    """t_arr, or t1 (span start) for a span without the agent's arrival time."""
    a = s.arrival
    return int(a) if a else int(s.time)


def _ttfb_us(s: SpanRow) -> float:
    """t2 − t1: the agent's value, else the span's duration (an SDK span's stand-in)."""
    v = s.ttfb_us
    return float(v) if v is not None else float(s.duration_us)


def _gaps(xs: Sequence[float], scale: float = 1.0) -> list[float]:
    if scale == 1.0:
        return list(map(operator.sub, xs[1:], xs))
    return [(b - a) * scale for a, b in itertools.pairwise(xs)]


_HOLD_MAX, _HOLD_REASON = sa.WIRE_HOLD_MAX_US.name, sa.WIRE_HOLD_REASON.name
_RETRANSMIT_WAIT = sa.RETRANSMIT_WAIT_US.name


def _attr_ms(attrs: Mapping[str, str] | None, name: str) -> float | None:
    """A µs attribute as the ingest keeps it (text) in ms; None when absent or not a whole
    non-negative number."""
    raw = (attrs or {}).get(name)
    if raw is None or raw == "":
        return None
    try:
        v = int(raw)
    except ValueError:
        return None
    return v / 1000.0 if v >= 0 else None


def hold_of(attrs: Mapping[str, str] | None) -> tuple[float | None, str]:
    """(longest write-to-wire hold in ms, its reason) from a span's attributes as the ingest
    wrote them; (None, '') where not measured."""
    v = _attr_ms(attrs, _HOLD_MAX)
    if v is None:
        return None, ""
    return v, str((attrs or {}).get(_HOLD_REASON) or "")


def _painted_after(first_chunk: float | None, first_token: float | None) -> float | None:
    """What the probe's paint follows: on an LLM stream the first answer token (the role-only
    delta or ``message_start`` shows nothing), else the first chunk (docs/probe.md)."""
    return first_chunk if first_token is None else first_token


# The server's parts: server_ttfb_ms, server_ttft_ms, server_duration_ms, server_itl_ms,
# server_timed, hop_added_ms, edge_itl_ms, network_ms, queue_ms, accept_queue_ms,
# recv_queue_ms, retransmits, srtt_ms, theta_ms, theta_delay_ms.
_ServerParts = tuple[
    float | None, float | None, float | None, list[float], bool, list[float], list[float],
    float | None, float | None, float | None, float | None, int | None, float | None,
    float | None, float | None,
]  # fmt: skip
# ... of an entry without a hop (the query API shows such entries): absent.
_NO_SERVER: _ServerParts = (
    None, None, None, [], False, [], [], None, None, None, None, None, None, None, None
)  # fmt: skip


def _server_parts(e: EntryRow, hops: Sequence[SpanRow], user_ttfb: float | None) -> _ServerParts:
    """The server's parts (_ServerParts) of the hops, edge first, origin last."""
    edge, origin = hops[0], hops[-1]
    o_ttfb_us, o_ttft = _ttfb_us(origin), origin.ttft_us
    server_itl = _gaps(origin.chunk_offsets_us or [], 1e-3)
    # Time each hop adds: its (t2 − t_arr) minus the next hop's; the origin's whole.
    edge_t2 = float(edge.time) + _ttfb_us(edge) * 1000.0
    edge_arrival = _arrival(edge)
    if edge is origin:  # one hop (most pairs): no lists to build
        hop_added = [(edge_t2 - edge_arrival) / 1e6]
    else:
        spans_ms = [(float(h.time) + _ttfb_us(h) * 1000.0 - _arrival(h)) / 1e6 for h in hops]
        hop_added = [a - b for a, b in itertools.pairwise(spans_ms)] + [spans_ms[-1]]
    o_arr = origin.arrival
    queue = (origin.time - o_arr) / 1e6 if o_arr else None
    rq = origin.recv_queue_us
    recv = None if rq is None else rq / 1000.0
    network = None if user_ttfb is None else user_ttfb - (edge_t2 - edge_arrival) / 1e6
    t0, t3 = e.request_start_ms, e.response_start_ms
    theta = None
    if t0 is not None and t3 is not None:
        # the browser's wall clock at t0/t3: time origin + relative time + its reported drift
        origin_ms = float(e.time_origin_ms) + float(e.clock_drift_ms or 0.0)
        theta = ((edge_arrival / 1e6 - (origin_ms + t0)) + (edge_t2 / 1e6 - (origin_ms + t3))) / 2.0
    srtt = edge.srtt_us
    return (
        o_ttfb_us / 1000.0,
        None if o_ttft is None else o_ttft / 1000.0,
        float(origin.duration_us) / 1000.0,
        server_itl,
        origin.ttfb_us is not None,
        hop_added,
        list(server_itl) if edge is origin else _gaps(edge.chunk_offsets_us or [], 1e-3),
        network,
        queue,
        None if queue is None or recv is None else max(0.0, queue - recv),
        recv,
        edge.retransmits,
        None if srtt is None else srtt / 1000.0,
        theta,
        network if theta is not None else None,
    )


_new = tuple.__new__
_SPAN_ID, _SERVICE = operator.attrgetter("span_id"), operator.attrgetter("service")


def derive(
    e: EntryRow,
    hops: Sequence[SpanRow],
    linked_span_ids: list[str] | None = None,
    reconnects: int = 0,
    sample_th: int = 0,
    version: int = 0,
) -> PairRow:
    """The pair of one browser entry and its hops (edge first, origin last): who, the parts
    (all ms; None where not measurable) and its LLM stream's (collector/pairing/llm.py).
    Without hops (an entry the query API shows unpaired) the server's parts are absent."""
    t0, t3 = e.request_start_ms, e.response_start_ms
    first, rendered, end = e.first_chunk_ms, e.rendered_ms, e.response_end_ms
    user_ttfb_ms = None if t0 is None or t3 is None else t3 - t0
    user_ttft_ms = None if t0 is None or first is None else first - t0
    user_visible_ttft_ms = None if t0 is None or rendered is None else rendered - t0
    user_duration_ms = None if t0 is None or end is None else end - t0
    user_itl_ms = _gaps(e.chunk_ms or [])
    shown = _painted_after(first, e.llm_first_token_ms)
    render_delay_ms = None if rendered is None or shown is None else rendered - shown
    origin = hops[-1] if hops else None
    (server_ttfb_ms, server_ttft_ms, server_duration_ms, server_itl_ms, server_timed,
     hop_added_ms, edge_itl_ms, network_ms, queue_ms, accept_queue_ms, recv_queue_ms,
     retransmits, srtt_ms, theta_ms, theta_delay_ms) = (
        _server_parts(e, hops, user_ttfb_ms) if hops else _NO_SERVER
    )  # fmt: skip
    wire_hold_ms, wire_hold_reason = hold_of(origin.attributes) if origin else (None, "")
    # the edge hop's, where its retransmits are counted
    retransmit_wait_ms = _attr_ms(hops[0].attributes, _RETRANSMIT_WAIT) if hops else None
    time_, paired_at = e.time, version // 1_000_000
    site, session, kind, trace_id, span_id = e.site, e.session, e.kind, e.trace_id, e.span_id
    seq, coarse, chunks_coarse = e.seq or 0, bool(e.coarse), bool(e.chunks_coarse)
    service = origin.service if origin else ""
    route = (origin.route if origin else "") or e.route or ""
    method = (origin.method if origin else "") or e.method or ""
    status = int((origin.status if origin else 0) or e.status or 0)
    if origin is not None and len(hops) == 1:  # most pairs
        hop_span_ids, hop_services = [origin.span_id], [origin.service]
    else:
        hop_span_ids, hop_services = list(map(_SPAN_ID, hops)), list(map(_SERVICE, hops))
    llm_columns = llm.pair_columns(
        t0, e, origin.attributes if origin else None, origin.ttft_us if origin else None
    )
    # PairRow's fields in order, each a local of its name (tests/collector/test_rows.py
    # holds this call to the column list): a plain tuple is built ~15× faster than by keyword.
    return _new(PairRow, (
        time_, version, paired_at, site, session, service, route, method, status, kind,
        trace_id, span_id, seq, coarse, chunks_coarse, user_ttfb_ms, user_ttft_ms,
        user_visible_ttft_ms, user_duration_ms, user_itl_ms, render_delay_ms, server_ttfb_ms,
        server_ttft_ms, server_duration_ms, server_itl_ms, server_timed, len(hops),
        hop_span_ids, hop_services, hop_added_ms, edge_itl_ms, linked_span_ids or [],
        reconnects, network_ms, queue_ms, accept_queue_ms, recv_queue_ms, retransmits,
        srtt_ms, theta_ms, theta_delay_ms, sample_th, wire_hold_ms, wire_hold_reason,
        *llm_columns, retransmit_wait_ms,
    ))  # fmt: skip


def _load_compiled() -> tuple[Any, str]:
    """(the configured compiled one-hop derivation or None, which derivation is in use)."""
    source = Path(__file__).with_name("_derive_fast.c")
    fast, why_not = load("collector.pairing._derive_fast", source, "PARALLAX_DERIVE_FAST")
    if fast is None:
        return None, f"pair derivation: Python (the compiled one-hop derivation {why_not})"
    absent = dict(zip(llm.PAIR_LLM_NAMES, llm.NO_LLM, strict=True))
    attrs = (_HOLD_MAX, _HOLD_REASON, _RETRANSMIT_WAIT, llm.DIALECT_ATTR)
    try:
        fast.configure(
            PairRow, EntryRow._fields, SpanRow._fields, absent, tuple(llm.PAIR_LLM_NAMES),
            llm.pair_columns, attrs,
        )  # fmt: skip
    except (ValueError, TypeError) as e:
        return None, f"pair derivation: Python (the compiled one-hop derivation unusable: {e})"
    return fast, f"pair derivation: compiled for one hop ({Path(fast.__file__ or '?').name})"


# derive_one(entry, span, sample_th, version): derive(entry, [span], [], 0, sample_th,
# version) in C (_derive_fast.c; tests/collector/test_derive_fast.py holds the two equal),
# or None for a row it does not model.
_compiled, DERIVATION = _load_compiled()


def pair(entry: EntryRow, spans: Sequence[SpanRow], version: int) -> PairRow | None:
    """The pair of ``entry`` among its trace's spans, or None if none is its."""
    cands = candidates(entry, spans)
    if not cands:
        return None
    if len(cands) == 1:  # one hop (most pairs): nothing to fold, order or count
        th = cands[0].sample_th or 0
        row = None if _compiled is None else _compiled.derive_one(entry, cands[0], th, version)
        return derive(entry, cands, [], 0, th, version) if row is None else row
    hops, linked, reconnects = arrange(cands)
    # Every hop decides on the trace id's randomness (consistent sampling): the pair
    # exists when any of its spans was kept, i.e. under the lowest threshold among them.
    th = min(c.sample_th or 0 for c in cands)
    return derive(entry, hops, linked, reconnects, th, version)


Trace = tuple[Sequence[SpanRow], Sequence[EntryRow]]


def pairs_for(
    traces: Iterable[Trace], version: int | None = None
) -> tuple[list[PairRow], set[str]]:
    """(the pairs of these traces — each item one trace's (spans, entries) —, the trace ids
    with one side missing: no entries, or an entry — the trace's last — without a span)."""
    out: list[PairRow] = []
    one_sided: set[str] = set()
    version = version or time.time_ns()
    for spans, entries in traces:
        paired = False
        for e in entries:
            row = pair(e, spans, version)
            paired = row is not None
            if paired:
                out.append(row)  # type: ignore[arg-type]
        if not paired:
            one_sided.add(entries[-1].trace_id if entries else spans[0].trace_id)
    return out, one_sided


def by_trace(spans: Iterable[SpanRow], entries: Iterable[EntryRow]) -> list[Trace]:
    """Rows of many traces grouped as pairs_for takes them."""
    groups: dict[str, tuple[list[SpanRow], list[EntryRow]]] = {}
    for s in spans:
        groups.setdefault(s.trace_id, ([], []))[0].append(s)
    for e in entries:
        groups.setdefault(e.trace_id, ([], []))[1].append(e)
    return list(groups.values())
