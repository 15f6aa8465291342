"""OTLP/HTTP trace requests (protobuf or JSON) → ``server_spans`` rows.

Only SERVER spans are stored (an app's SDK also exports internal and client spans; those
are counted as ignored, not rejected). Attributes named in parallax_contracts become typed
columns; the rest are kept as strings in ``attributes``, and with them who served the span:
the Resource's container and Kubernetes identity (``sa.RESOURCE_STORED``, string values only;
the Resource's value wins over a span attribute of the same name).
"""

from __future__ import annotations

import math
from functools import lru_cache
from pathlib import Path
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from collector.ingest import otlp_common
from collector.ingest.common import FUTURE_SLACK_NS, MAX_DURATION_NS, Parsed, outside_window
from collector.ingest.otlp_common import any_value as _value
from collector.ingest.otlp_common import as_int as _int
from collector.ingest.otlp_common import as_number
from collector.ingest.otlp_common import as_str as _str
from collector.store.rows import SpanRow
from parallax_contracts import sampling
from parallax_contracts import span_attributes as sa
from parallax_contracts.compiled import load
from parallax_contracts.routes import route_template

_ZERO_TRACE = bytes(16)
_STORED = frozenset(sa.RESOURCE_STORED)
_ZERO_SPAN = bytes(8)
_SERVER = Span.SpanKind.SPAN_KIND_SERVER

# Typed columns fed from attributes: attribute name → column key.
_INT_US = {
    sa.TTFB_US.name: "ttfb_us",
    sa.RECV_QUEUE_US.name: "recv_queue_us",
    sa.ACCEPT_QUEUE_US.name: "accept_queue_us",
    sa.TTFT_US.name: "ttft_us",
    sa.CHUNK_GAP_MAX_US.name: "chunk_gap_max_us",
    sa.SRTT_US.name: "srtt_us",
}
_INT_COUNT = {
    sa.CHUNKS.name: "chunks",
    sa.BYTES_IN.name: "bytes_in",
    sa.BYTES_OUT.name: "bytes_out",
    sa.RETRANSMITS.name: "retransmits",
}
_TTFB, _RECV_Q, _ACCEPT_Q, _TTFT, _GAP_MAX, _SRTT = (
    sa.TTFB_US.name,
    sa.RECV_QUEUE_US.name,
    sa.ACCEPT_QUEUE_US.name,
    sa.TTFT_US.name,
    sa.CHUNK_GAP_MAX_US.name,
    sa.SRTT_US.name,
)
_CHUNKS, _BYTES_IN, _BYTES_OUT, _RETRANS = (
    sa.CHUNKS.name,
    sa.BYTES_IN.name,
    sa.BYTES_OUT.name,
    sa.RETRANSMITS.name,
)
_DURATION, _OFFSETS, _ARRIVAL = (
    sa.DURATION_US.name,
    sa.CHUNK_OFFSETS_US.name,
    sa.ARRIVAL_UNIX_NS.name,
)
_URL_PATH, _HTTP_ROUTE, _METHOD, _STATUS = (
    sa.URL_PATH.name,
    sa.HTTP_ROUTE.name,
    sa.HTTP_REQUEST_METHOD.name,
    sa.HTTP_RESPONSE_STATUS_CODE.name,
)
_SOURCE, _SERVER_ADDRESS, _SERVER_PORT, _CLIENT_ADDRESS, _CLIENT_PORT = (
    sa.SOURCE.name,
    sa.SERVER_ADDRESS.name,
    sa.SERVER_PORT.name,
    sa.CLIENT_ADDRESS.name,
    sa.CLIENT_PORT.name,
)
_WS_SEQ, _PARTIAL, _CLIENT_ABORTED, _TRACEPARENT_MISSED = (
    sa.WS_SEQ.name,
    sa.PARTIAL.name,
    sa.CLIENT_ABORTED.name,
    sa.TRACEPARENT_MISSED.name,
)
# The GPU attributes, in schema.SPAN_GPU_COLUMNS order (their columns follow the others).
_GPU_LAUNCHES = (sa.GPU_PREFILL_LAUNCHES.name, sa.GPU_DECODE_LAUNCHES.name)
_GPU_WAITS = (sa.GPU_PREFILL_WAIT_US.name, sa.GPU_DECODE_WAIT_US.name)
_GPU_DOUBLES = (
    sa.GPU_PREFILL_SM_UTIL_PCT.name,
    sa.GPU_DECODE_SM_UTIL_PCT.name,
    sa.GPU_SAMPLE_COVERAGE.name,
    sa.GPU_INFLIGHT_MEAN.name,
)
_GPU_NAMES = (*_GPU_LAUNCHES, *_GPU_WAITS, *_GPU_DOUBLES, sa.GPU_UUID.name)
assert frozenset(_GPU_NAMES) == {a.name for a in sa.GPU}
# Column limits (collector/store/schema.py): durations Int64, counts UInt32/UInt64.
_I64 = 2**63 - 1
_U32, _U64 = 2**32, 2**64
_CONSUMED = frozenset(
    {
        *_INT_US,
        *_INT_COUNT,
        sa.HTTP_REQUEST_METHOD.name,
        "http.method",
        sa.URL_PATH.name,
        "http.target",
        sa.HTTP_ROUTE.name,
        sa.HTTP_RESPONSE_STATUS_CODE.name,
        "http.status_code",
        sa.SERVER_ADDRESS.name,
        sa.SERVER_PORT.name,
        sa.CLIENT_ADDRESS.name,
        sa.CLIENT_PORT.name,
        sa.ARRIVAL_UNIX_NS.name,
        sa.DURATION_US.name,
        sa.CHUNK_OFFSETS_US.name,
        sa.WS_SEQ.name,
        sa.PARTIAL.name,
        sa.CLIENT_ABORTED.name,
        sa.TRACEPARENT_MISSED.name,
        sa.SOURCE.name,
        *_GPU_NAMES,
    }
)


def _any(v: Any) -> Any:
    """One AnyValue; the common scalar and int-array cases inline (hot path: every access to
    a protobuf element builds a Python object, so each is read once)."""
    w = v.WhichOneof("value")
    if w == "int_value":
        return v.int_value
    if w == "string_value":
        return v.string_value
    if w == "array_value":
        vals = v.array_value.values
        ints = [x.int_value for x in vals]
        # int_value reads 0 for an element of another type: take the slow path then.
        if 0 in ints or not ints:
            ints = [
                x.int_value if x.WhichOneof("value") == "int_value" else _value(x) for x in vals
            ]
        return ints
    return _value(v)


# The attributes that have a column, by slot in the list _span_attrs fills (one pass over a
# span's attributes puts each where _span_row unpacks it; the rest go to ``attributes``), in
# groups: the measures (_measures), the HTTP fields (_http_fields), the source, the peers and
# the flags, then the GPU's.
_MEASURE_NAMES = (_TTFB, _RECV_Q, _ACCEPT_Q, _TTFT, _GAP_MAX, _SRTT, _DURATION, _CHUNKS,
                  _BYTES_IN, _BYTES_OUT, _RETRANS, _OFFSETS, _ARRIVAL)  # fmt: skip
_HTTP_NAMES = (_URL_PATH, "http.target", _HTTP_ROUTE, _METHOD, "http.method", _STATUS,
               "http.status_code")  # fmt: skip
_PEER_NAMES = (_SOURCE, _SERVER_ADDRESS, _SERVER_PORT, _CLIENT_ADDRESS, _CLIENT_PORT, _WS_SEQ,
               _PARTIAL, _CLIENT_ABORTED, _TRACEPARENT_MISSED)  # fmt: skip
_SLOT_NAMES = (*_MEASURE_NAMES, *_HTTP_NAMES, *_PEER_NAMES, *_GPU_NAMES)
_S_HTTP = len(_MEASURE_NAMES)  # the first slot after the measures
_TRACE_ID = SpanRow._fields.index("trace_id")
_N_SLOTS_V1 = _SLOT_NAMES.index(_GPU_NAMES[0])  # the slots before the GPU ones
_SLOT = {name: i for i, name in enumerate(_SLOT_NAMES)}.get
_INT_SLOT = {
    name: i
    for i, name in enumerate(_SLOT_NAMES)
    if name in _INT_US
    or name in _INT_COUNT
    or name
    in (
        _DURATION,
        _ARRIVAL,
        _STATUS,
        "http.status_code",
        _SERVER_PORT,
        _CLIENT_PORT,
        _WS_SEQ,
        *_GPU_LAUNCHES,
        *_GPU_WAITS,
    )
}.get
_STR_SLOT = {
    name: i
    for i, name in enumerate(_SLOT_NAMES)
    if name
    in (
        _URL_PATH,
        "http.target",
        _HTTP_ROUTE,
        _METHOD,
        "http.method",
        _SOURCE,
        _SERVER_ADDRESS,
        _CLIENT_ADDRESS,
        sa.GPU_UUID.name,
    )
}.get
_NO_VALUES = (None,) * len(_SLOT_NAMES)
_JUST_INT = {int}
assert frozenset(_SLOT_NAMES) == _CONSUMED


def _span_attrs(kvs: Any) -> tuple[list[Any], dict[str, Any] | None]:
    """(values of the attributes with a column, by slot; the others by name, or None).

    An attribute whose column is an integer (a string) is read as one first: a value of
    another type reads 0 (''), and only then is its type asked (WhichOneof is a call per
    attribute, a tenth of the span's parsing)."""
    vals = list(_NO_VALUES)
    rest: dict[str, Any] | None = None
    for kv in kvs:
        k = kv.key
        v = kv.value
        i = _INT_SLOT(k)
        if i is not None:
            x = v.int_value
            vals[i] = x if x else _any(v)
            continue
        i = _STR_SLOT(k)
        if i is not None:
            x = v.string_value
            vals[i] = x if x else _any(v)
            continue
        i = _SLOT(k)
        if i is not None:
            vals[i] = _any(v)
        elif rest is None:
            rest = {k: _any(v)}
        else:
            rest[k] = _any(v)
    return vals, rest


@lru_cache(maxsize=4096)
def _route(path: str, http_route: str | None) -> str:
    return route_template(path, http_route)


def decode(body: bytes, json_body: bool) -> ExportTraceServiceRequest:
    return otlp_common.decode(body, json_body, ExportTraceServiceRequest())


def parse(body: bytes, json_body: bool, received_ns: int, oldest_ns: int, now_ns: int) -> Parsed:
    """Rows for server_spans (column order of schema.SPAN_COLUMNS).

    A protobuf body goes to the compiled decoder first; it answers only the plain case
    (every span stored, the expected attribute types) and gives up on the rest, which
    parse_python then handles — the reference for what the rows are."""
    if not json_body and _fast is not None:
        r = _fast.parse(body, received_ns // 1_000_000, oldest_ns, now_ns)
        if r is not None:
            return Parsed(rows=r[0], trace_ids=r[1], ignored=r[2])
    return parse_python(body, json_body, received_ns, oldest_ns, now_ns)


def parse_python(
    body: bytes, json_body: bool, received_ns: int, oldest_ns: int, now_ns: int
) -> Parsed:
    """parse() with the protobuf runtime (both encodings): the reference implementation."""
    req = decode(body, json_body)
    out = Parsed()
    received_ms = received_ns // 1_000_000
    for rs in req.resource_spans:
        res = {kv.key: _value(kv.value) for kv in rs.resource.attributes}
        service = str(res.get(sa.RESOURCE_SERVICE_NAME) or "unknown_service")
        host = str(res.get(sa.RESOURCE_HOST_NAME) or "")
        pid = _int(res.get(sa.RESOURCE_PROCESS_PID)) or 0
        ident = {k: v for k, v in res.items() if k in _STORED and type(v) is str}
        for ss in rs.scope_spans:
            for sp in ss.spans:
                if sp.kind != _SERVER:
                    out.ignored += 1
                    continue
                row = _span_row(sp, service, host, pid, ident, received_ms, oldest_ns, now_ns, out)
                if row is not None:
                    out.rows.append(row)
                    out.trace_ids.append(row[_TRACE_ID])
    return out


def _span_row(
    sp: Any,
    service: str,
    host: str,
    pid: int,
    ident: dict[str, str],
    received_ms: int,
    oldest_ns: int,
    now_ns: int,
    out: Parsed,
) -> tuple[Any, ...] | None:
    """The span's row, or None when it is rejected (counted in ``out.rejected`` by reason).
    Checked in this order: the span's ids and times, its measures, its strings."""
    tid, sid, pid_b = sp.trace_id, sp.span_id, sp.parent_span_id
    start, end = sp.start_time_unix_nano, sp.end_time_unix_nano
    why = _envelope_problem(tid, sid, pid_b, start, end, oldest_ns, now_ns)
    if why is not None:
        out.rejected[why] += 1
        return None
    vals, extra = _span_attrs(sp.attributes)
    measures = _measures(vals, end - start)
    if type(measures) is str:
        out.rejected[measures] += 1
        return None
    (url_path, http_target, http_route, method_v, http_method, status_v, http_status, source,
     server_address, server_port, client_address, client_port, ws_seq, partial,
     client_aborted, traceparent_missed) = vals[_S_HTTP:_N_SLOTS_V1]  # fmt: skip
    # A NUL in a string the row stores: the beacon contract's rule (parallax_contracts.beacon).
    name = sp.name
    if _has_nul(
        name, service, host, url_path, http_target, http_route, method_v, http_method, source,
        server_address, client_address, *(extra or {}).items(), *ident.values(),
    ):  # fmt: skip
        out.rejected["invalid_string"] += 1
        return None
    method, route, path, status = _http_fields(
        name, url_path, http_target, http_route, method_v, http_method, status_v, http_status
    )
    # Attributes without a column of their own are kept as strings (few, for the agent).
    rest = {} if extra is None else {k: _str(v) for k, v in extra.items()}
    if ident:  # who served it (the Resource's identity): wins over a span attribute
        rest.update(ident)
    # The sampling the span states (tracestate ot=th:…); none or an invalid one: kept with
    # probability 1 (threshold 0), as any span from a source that does not sample.
    ts = sp.trace_state
    th = sampling.th_from_tracestate(ts) if ts else None
    gpu = vals[_N_SLOTS_V1:]
    return (  # schema.SPAN_COLUMNS' order
        start,
        end,
        received_ms,
        tid.hex(),
        sid.hex(),
        pid_b.hex() if pid_b else "",
        name,
        str(source or "sdk"),
        service,
        host,
        pid,
        method,
        route,
        path,
        status,
        str(server_address or ""),
        server_port
        if type(server_port) is int and 0 <= server_port < 65536
        else _port(server_port),
        str(client_address or ""),
        client_port
        if type(client_port) is int and 0 <= client_port < 65536
        else _port(client_port),
        *measures,
        _u32(_int(ws_seq)) if ws_seq is not None else 0,
        partial is True,
        client_aborted is True,
        traceparent_missed is True,
        rest,
        *(_NO_GPU if gpu == _NO_GPU_VALUES else _gpu_columns(gpu)),
        th or 0,
    )


def _envelope_problem(
    tid: bytes, sid: bytes, pid_b: bytes, start: int, end: int, oldest_ns: int, now_ns: int
) -> str | None:
    """Why the span's own ids or times reject it, if they do: ids of the wrong length or all
    zero, an end before the start, a span over 24 h, a start outside the kept window."""
    if len(tid) != 16 or tid == _ZERO_TRACE:
        return "invalid_trace_id"
    if len(sid) != 8 or sid == _ZERO_SPAN or (pid_b and len(pid_b) != 8):
        return "invalid_span_id"
    if end < start:
        return "negative_duration"
    if end - start > MAX_DURATION_NS:
        return "duration_over_24h"
    return outside_window(start, oldest_ns, now_ns)


def _measures(vals: list[Any], span_ns: int) -> tuple[Any, ...] | str:
    """The measure columns (arrival … retransmits, schema.SPAN_COLUMNS' order) from the
    measure attributes (the first slots of ``vals``: _MEASURE_NAMES), or why they reject the
    span: a negative duration, one over 24 h, a value its column cannot hold."""
    (ttfb, recv_q, accept_q, ttft, gap_max, srtt, dur, chunks, bytes_in, bytes_out, retrans,
     offsets_raw, arrival) = vals[:_S_HTTP]  # fmt: skip
    # Unrolled on purpose (hot path): an int attribute (or an absent one) is taken as it
    # is, anything else through _int (a float with no fraction, a digit string; else None).
    if ttfb is not None and type(ttfb) is not int:
        ttfb = _int(ttfb)
    if recv_q is not None and type(recv_q) is not int:
        recv_q = _int(recv_q)
    if accept_q is not None and type(accept_q) is not int:
        accept_q = _int(accept_q)
    if ttft is not None and type(ttft) is not int:
        ttft = _int(ttft)
    if gap_max is not None and type(gap_max) is not int:
        gap_max = _int(gap_max)
    if srtt is not None and type(srtt) is not int:
        srtt = _int(srtt)
    if dur is not None and type(dur) is not int:
        dur = _int(dur)
    durations = [v for v in (ttfb, recv_q, accept_q, ttft, gap_max, srtt, dur) if v is not None]
    if durations and min(durations) < 0:
        return "negative_duration"
    if dur is not None and dur * 1000 > MAX_DURATION_NS:
        return "duration_over_24h"
    if chunks is not None and type(chunks) is not int:
        chunks = _int(chunks)
    if bytes_in is not None and type(bytes_in) is not int:
        bytes_in = _int(bytes_in)
    if bytes_out is not None and type(bytes_out) is not int:
        bytes_out = _int(bytes_out)
    if retrans is not None and type(retrans) is not int:
        retrans = _int(retrans)
    if type(offsets_raw) is not list:
        offsets: list[int] = []
    elif {*map(type, offsets_raw)} == _JUST_INT:  # every element an int (no bool): as is
        offsets = offsets_raw
    else:
        offsets = [v for v in (_int(x) for x in offsets_raw) if v is not None]
    if arrival is not None and type(arrival) is not int:
        arrival = _int(arrival)
    # A value its column cannot hold would make the whole batch's insert fail for ever (and
    # block every later one behind it): reject the span here, where it entered.
    if (
        (durations and max(durations) > _I64)
        or (arrival is not None and arrival > _I64)
        or (offsets and (min(offsets) < 0 or max(offsets) > _I64))
        or (chunks is not None and chunks >= _U32)
        or (retrans is not None and retrans >= _U32)
        or (bytes_in is not None and bytes_in >= _U64)
        or (bytes_out is not None and bytes_out >= _U64)
    ):
        return "out_of_range"
    return (
        arrival if arrival and arrival > 0 else None,
        ttfb,
        recv_q,
        accept_q,
        ttft,
        dur if dur is not None else span_ns // 1000,  # none stated: the span's own
        offsets,
        chunks if chunks is None or chunks >= 0 else None,  # a negative count: absent
        gap_max,
        bytes_in if bytes_in is None or bytes_in >= 0 else None,
        bytes_out if bytes_out is None or bytes_out >= 0 else None,
        srtt,
        retrans if retrans is None or retrans >= 0 else None,
    )


def _http_fields(
    name: str,
    url_path: Any,
    http_target: Any,
    http_route: Any,
    method_v: Any,
    http_method: Any,
    status_v: Any,
    http_status: Any,
) -> tuple[str, str, str, int]:
    """(method, route, path, status) as stored: the stable attributes, else the old ones
    (http.target, http.method, http.status_code); no path and no route: the span's name."""
    path = str(url_path or http_target or "")
    route = _route(path, str(http_route) if http_route else None) if (path or http_route) else name
    method = str(method_v or http_method or "")
    status = status_v or http_status
    status = status if type(status) is int and 0 <= status < 65536 else _u16(_int(status))
    return method.upper()[:16], route[:512], path.split("?", 1)[0][:2048], status


_NO_GPU_VALUES = [None] * len(_GPU_NAMES)
_NO_GPU = (None,) * (len(_GPU_NAMES) - 1) + ("",)
_U32_MAX = 2**32 - 1


def _gpu_columns(raw: list[Any]) -> tuple[Any, ...]:
    """The GPU columns of a span. A value outside its column's domain (a negative count or
    wait, a share over 100 %, NaN, another type) is stored as absent: the span's own
    timings stay good, and a made-up GPU figure would be worse than none."""
    pl, dl, pw, dw, pu, du, cov, inflight, uuid = raw
    return (
        *(v if v is not None and 0 <= v <= _U32_MAX else None for v in map(_int, (pl, dl))),
        *(v if v is not None and 0 <= v <= _I64 else None for v in map(_int, (pw, dw))),
        as_number(pu, 0.0, 100.0),
        as_number(du, 0.0, 100.0),
        as_number(cov, 0.0, 1.0),
        as_number(inflight, 0.0, math.inf),
        uuid[:1024] if type(uuid) is str else "",
    )


# --- the compiled decoder (collector/ingest/_otlp_fast.c, parallax_contracts/compiled.py) ---
# Attribute names in the C decoder's slot order: the ints, the strings and the flags (each
# in _SLOT_NAMES order), the doubles, the offsets array, then the resource attributes it
# reads: the three with a column, then the identity kept in ``attributes``
# (sa.RESOURCE_STORED). The tests draw attributes by these groups.
_FLAGS = (_PARTIAL, _CLIENT_ABORTED, _TRACEPARENT_MISSED)
_FAST_INTS = tuple(n for n in _SLOT_NAMES if _INT_SLOT(n) is not None)
_FAST_STRS = tuple(n for n in _SLOT_NAMES if _STR_SLOT(n) is not None)
_FAST_NAMES = (
    *_FAST_INTS,
    *_FAST_STRS,
    *_FLAGS,
    *_GPU_DOUBLES,
    _OFFSETS,
    sa.RESOURCE_SERVICE_NAME,
    sa.RESOURCE_HOST_NAME,
    sa.RESOURCE_PROCESS_PID,
    *sa.RESOURCE_STORED,
)
# 12 identity names: N_NAMES in _otlp_fast.c (a longer list needs the C changed with it).
assert len(_FAST_NAMES) == 41 + 12 and frozenset(_FAST_NAMES[:38]) == _CONSUMED


def _load_fast() -> tuple[Any, str]:
    """(the configured module or None, which decoder is in use — said once in the log)."""
    source = Path(__file__).with_name("_otlp_fast.c")
    fast, why_not = load("collector.ingest._otlp_fast", source, "PARALLAX_OTLP_FAST")
    if fast is None:
        return None, f"OTLP protobuf decoder: pure Python (compiled decoder {why_not})"
    try:
        fast.configure(_FAST_NAMES, _route, MAX_DURATION_NS, FUTURE_SLACK_NS)
    except (ValueError, TypeError) as e:
        return None, f"OTLP protobuf decoder: pure Python (compiled decoder unusable: {e})"
    return fast, f"OTLP protobuf decoder: compiled ({Path(fast.__file__ or '?').name})"


_fast, DECODER = _load_fast()


def _port(v: Any) -> int:
    return v if type(v) is int and 0 <= v < 65536 else _u16(_int(v))


def _has_nul(*values: Any) -> bool:  # a (key, value) pair: either of them
    for v in values:  # a loop, not any() over a generator: a third of the time
        if type(v) is str:
            if "\x00" in v:
                return True
        elif type(v) is tuple and _has_nul(*v):
            return True
    return False


def _u16(v: int | None) -> int:
    return v if v is not None and 0 <= v < 65536 else 0


def _u32(v: int | None) -> int:
    return v if v is not None and 0 <= v < 2**32 else 0


def response(rejected: int, message: str, json_body: bool) -> tuple[bytes, str]:
    """The OTLP ExportTraceServiceResponse (partial success when something was rejected)."""
    resp = ExportTraceServiceResponse()
    return otlp_common.answer(resp, "rejected_spans", rejected, message, json_body)
