"""OTLP/HTTP trace requests (protobuf or JSON) → ``server_spans`` rows.

Only SERVER spans are stored (an app's SDK also exports internal and client spans; those
are counted as ignored, not rejected). Attributes named in parallax_contracts become typed
columns; the rest are kept as strings in ``attributes``.
"""

from __future__ import annotations

import base64
import json
from functools import lru_cache
from typing import Any

from google.protobuf import json_format  # type: ignore[import-untyped]
from google.protobuf.message import DecodeError  # type: ignore[import-untyped]
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from collector.ingest.common import FUTURE_SLACK_NS, MAX_DURATION_NS, BadRequestError, Parsed
from parallax_contracts import span_attributes as sa
from parallax_contracts.routes import route_template

_ZERO_TRACE = bytes(16)
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
# Column limits (collector/store/schema.py): durations Int64, counts UInt32/UInt64.
_I64 = 2**63 - 1
_COUNT_LIMIT = {"chunks": 2**32, "bytes_in": 2**64, "bytes_out": 2**64, "retransmits": 2**32}
_CONSUMED = {
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
}


def _value(v: Any) -> Any:
    which = v.WhichOneof("value")
    if which is None:
        return None
    if which == "array_value":
        return [_value(x) for x in v.array_value.values]
    if which == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in v.kvlist_value.values}
    if which == "bytes_value":
        return v.bytes_value.hex()
    return getattr(v, which)


def _attrs(kvs: Any) -> dict[str, Any]:
    """Attributes as Python values; the common scalar and int-array cases inline (hot path)."""
    out: dict[str, Any] = {}
    for kv in kvs:
        v = kv.value
        w = v.WhichOneof("value")
        if w == "int_value":
            out[kv.key] = v.int_value
        elif w == "string_value":
            out[kv.key] = v.string_value
        elif w == "array_value":
            vals = v.array_value.values
            out[kv.key] = [
                x.int_value if x.WhichOneof("value") == "int_value" else _value(x) for x in vals
            ]
        else:
            out[kv.key] = _value(v)
    return out


@lru_cache(maxsize=4096)
def _route(path: str, http_route: str | None) -> str:
    return route_template(path, http_route)


def _int(x: Any) -> int | None:
    if type(x) is int:
        return x
    if isinstance(x, bool) or x is None:
        return None
    if isinstance(x, int):
        return x
    if isinstance(x, float) and x.is_integer():
        return int(x)
    if isinstance(x, str) and x.lstrip("-").isdigit():
        return int(x)
    return None


def _hex_ids_to_b64(node: Any) -> None:
    """OTLP/JSON writes ids as hex; protobuf's JSON mapping wants base64 for bytes."""
    if isinstance(node, dict):
        for k, v in node.items():
            if k in ("traceId", "spanId", "parentSpanId", "trace_id", "span_id", "parent_span_id"):
                if isinstance(v, str) and v:
                    try:
                        node[k] = base64.b64encode(bytes.fromhex(v)).decode()
                    except ValueError:
                        raise BadRequestError(f"{k} is not hex: {v[:40]!r}") from None
            else:
                _hex_ids_to_b64(v)
    elif isinstance(node, list):
        for x in node:
            _hex_ids_to_b64(x)


def decode(body: bytes, json_body: bool) -> ExportTraceServiceRequest:
    req = ExportTraceServiceRequest()
    if json_body:
        try:
            doc = json.loads(body)
        except (ValueError, UnicodeDecodeError) as e:
            raise BadRequestError(f"malformed JSON: {e}") from None
        if not isinstance(doc, dict):
            raise BadRequestError("OTLP JSON body must be an object")
        _hex_ids_to_b64(doc)
        try:
            json_format.ParseDict(doc, req, ignore_unknown_fields=True)
        except (json_format.ParseError, ValueError, TypeError) as e:
            raise BadRequestError(f"malformed OTLP JSON: {str(e).splitlines()[0][:200]}") from None
    else:
        try:
            req.ParseFromString(body)
        except DecodeError as e:
            raise BadRequestError(f"malformed protobuf: {e}") from None
    return req


def parse(body: bytes, json_body: bool, received_ns: int, oldest_ns: int, now_ns: int) -> Parsed:
    """Rows for server_spans (column order of schema.SPAN_COLUMNS)."""
    req = decode(body, json_body)
    out = Parsed()
    received_ms = received_ns // 1_000_000
    for rs in req.resource_spans:
        res = {kv.key: _value(kv.value) for kv in rs.resource.attributes}
        service = str(res.get(sa.RESOURCE_SERVICE_NAME) or "unknown_service")
        host = str(res.get(sa.RESOURCE_HOST_NAME) or "")
        pid = _int(res.get(sa.RESOURCE_PROCESS_PID)) or 0
        for ss in rs.scope_spans:
            for sp in ss.spans:
                if sp.kind != _SERVER:
                    out.ignored += 1
                    continue
                row = _span_row(sp, service, host, pid, received_ms, oldest_ns, now_ns, out)
                if row is not None:
                    out.rows.append(row)
                    out.trace_ids.append(row[3])
    return out


def _span_row(
    sp: Any,
    service: str,
    host: str,
    pid: int,
    received_ms: int,
    oldest_ns: int,
    now_ns: int,
    out: Parsed,
) -> tuple[Any, ...] | None:
    tid, sid, pid_b = sp.trace_id, sp.span_id, sp.parent_span_id
    if len(tid) != 16 or tid == _ZERO_TRACE:
        out.rejected["invalid_trace_id"] += 1
        return None
    if len(sid) != 8 or sid == _ZERO_SPAN or (pid_b and len(pid_b) != 8):
        out.rejected["invalid_span_id"] += 1
        return None
    start, end = sp.start_time_unix_nano, sp.end_time_unix_nano
    if end < start:
        out.rejected["negative_duration"] += 1
        return None
    if end - start > MAX_DURATION_NS:
        out.rejected["duration_over_24h"] += 1
        return None
    if start < oldest_ns:
        out.rejected["older_than_retention"] += 1
        return None
    if start > now_ns + FUTURE_SLACK_NS:
        out.rejected["in_future"] += 1
        return None
    attrs = _attrs(sp.attributes)
    us = {col: _int(attrs.get(name)) for name, col in _INT_US.items()}
    dur = _int(attrs.get(sa.DURATION_US.name))
    for v in (*us.values(), dur):
        if v is not None and v < 0:
            out.rejected["negative_duration"] += 1
            return None
    if dur is not None and dur * 1000 > MAX_DURATION_NS:
        out.rejected["duration_over_24h"] += 1
        return None
    counts = {col: _int(attrs.get(name)) for name, col in _INT_COUNT.items()}
    offsets_raw = attrs.get(sa.CHUNK_OFFSETS_US.name)
    offsets = (
        [v for v in (_int(x) for x in offsets_raw) if v is not None]
        if isinstance(offsets_raw, list)
        else []
    )
    arrival = _int(attrs.get(sa.ARRIVAL_UNIX_NS.name))
    # A value its column cannot hold would make the whole batch's insert fail for ever (and
    # block every later one behind it): reject the span here, where it entered.
    if (
        any(v is not None and v > _I64 for v in (*us.values(), dur, arrival))
        or any(not 0 <= v <= _I64 for v in offsets)
        or any(v is not None and v >= _COUNT_LIMIT[col] for col, v in counts.items())
    ):
        out.rejected["out_of_range"] += 1
        return None
    path = str(attrs.get(sa.URL_PATH.name) or attrs.get("http.target") or "")
    http_route = attrs.get(sa.HTTP_ROUTE.name)
    route = (
        _route(path, str(http_route) if http_route else None) if (path or http_route) else sp.name
    )
    method = str(attrs.get(sa.HTTP_REQUEST_METHOD.name) or attrs.get("http.method") or "")
    status = _int(attrs.get(sa.HTTP_RESPONSE_STATUS_CODE.name) or attrs.get("http.status_code"))
    rest = {k: _str(v) for k, v in attrs.items() if k not in _CONSUMED}
    return (
        start,
        end,
        received_ms,
        tid.hex(),
        sid.hex(),
        pid_b.hex() if pid_b else "",
        sp.name,
        str(attrs.get(sa.SOURCE.name) or "sdk"),
        service,
        host,
        pid,
        method.upper()[:16],
        route[:512],
        path.split("?", 1)[0][:2048],
        _u16(status),
        str(attrs.get(sa.SERVER_ADDRESS.name) or ""),
        _u16(_int(attrs.get(sa.SERVER_PORT.name))),
        str(attrs.get(sa.CLIENT_ADDRESS.name) or ""),
        _u16(_int(attrs.get(sa.CLIENT_PORT.name))),
        arrival if arrival and arrival > 0 else None,
        us["ttfb_us"],
        us["recv_queue_us"],
        us["accept_queue_us"],
        us["ttft_us"],
        dur if dur is not None else (end - start) // 1000,
        offsets,
        _nonneg(counts["chunks"]),
        us["chunk_gap_max_us"],
        _nonneg(counts["bytes_in"]),
        _nonneg(counts["bytes_out"]),
        us["srtt_us"],
        _nonneg(counts["retransmits"]),
        _u32(_int(attrs.get(sa.WS_SEQ.name))),
        attrs.get(sa.PARTIAL.name) is True,
        attrs.get(sa.CLIENT_ABORTED.name) is True,
        attrs.get(sa.TRACEPARENT_MISSED.name) is True,
        rest,
    )


def _str(v: Any) -> str:
    return v if isinstance(v, str) else json.dumps(v)


def _u16(v: int | None) -> int:
    return v if v is not None and 0 <= v < 65536 else 0


def _u32(v: int | None) -> int:
    return v if v is not None and 0 <= v < 2**32 else 0


def _nonneg(v: int | None) -> int | None:
    return v if v is not None and v >= 0 else None


def response(rejected: int, message: str, json_body: bool) -> tuple[bytes, str]:
    """The OTLP ExportTraceServiceResponse (partial success when something was rejected)."""
    resp = ExportTraceServiceResponse()
    if rejected:
        resp.partial_success.rejected_spans = rejected
        resp.partial_success.error_message = message
    if json_body:
        return (
            json_format.MessageToJson(resp, indent=None).encode(),
            "application/json",
        )
    return resp.SerializeToString(), "application/x-protobuf"
