"""OTLP/protobuf for the agent's spans, written directly from their fields.

The OpenTelemetry SDK's way — a ``ReadableSpan`` per record, then its encoder building the
generated protobuf messages field by field — cost ~90 µs of the agent's CPU per span here,
three times the rest of its work on a request (docs/benchmarks.md, "Spans to OTLP"). A span
is one small message of known shape, so it is written here as bytes: each attribute's key
once per process, its value by type. What comes out is what the SDK's encoder gives for
the same span (tests/agent/test_otlp_wire.py parses both and compares them); the SDK still
sends it (its transport: endpoint, headers, TLS, compression and retries from the
``OTEL_EXPORTER_OTLP_*`` settings).

Field numbers: opentelemetry/proto/{trace,common,resource}/v1/*.proto.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from parallax_contracts import compiled

_SMALL = [bytes((i,)) for i in range(128)]
_U64 = struct.Struct("<Q").pack
_F64 = struct.Struct("<d").pack
_U32 = struct.Struct("<I").pack


def varint(n: int) -> bytes:
    """A base-128 varint; a negative int64 as its 64-bit two's complement (10 bytes)."""
    if 0 <= n < 0x80:
        return _SMALL[n]
    n &= 0xFFFFFFFFFFFFFFFF
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field: its tag byte(s), the length, the payload."""
    return tag + varint(len(payload)) + payload


def any_value(v: Any) -> bytes:
    """AnyValue: string 1, bool 2, int 3, double 4, array 5, kvlist 6, bytes 7 (a oneof:
    written even when zero or empty, as the SDK's messages do; None: an empty AnyValue)."""
    t = type(v)
    if t is str:
        b: bytes = v.encode()
        return b"\x0a" + varint(len(b)) + b
    if t is int:
        return b"\x18" + varint(v)
    if t is bool:
        return b"\x10\x01" if v else b"\x10\x00"
    if t is float:
        return b"\x21" + _F64(v)
    if t is list or t is tuple:
        return _field(b"\x2a", b"".join([_field(b"\x0a", any_value(x)) for x in v]))
    return _any_value_rare(v)


def _any_value_rare(v: Any) -> bytes:
    # subclasses (an IntEnum, a str subclass) and the types records do not carry
    if v is None:
        return b""
    if isinstance(v, bool):
        return b"\x10\x01" if v else b"\x10\x00"
    if isinstance(v, str):
        return _field(b"\x0a", v.encode())
    if isinstance(v, int):
        return b"\x18" + varint(int(v))
    if isinstance(v, float):
        return b"\x21" + _F64(v)
    if isinstance(v, bytes):
        return _field(b"\x3a", v)
    if isinstance(v, Mapping):
        kvs = [_field(b"\x0a", key_value(str(k), x)) for k, x in v.items()]
        return _field(b"\x32", b"".join(kvs))
    if isinstance(v, Sequence):  # (as the SDK: a set or a generator is no attribute value)
        return _field(b"\x2a", b"".join([_field(b"\x0a", any_value(x)) for x in v]))
    raise TypeError(f"an attribute value of type {type(v).__name__}")


_KEYS: dict[str, bytes] = {}  # attribute name → its KeyValue key field (a few dozen names)


def _key(key: str) -> bytes:
    k = _field(b"\x0a", key.encode()) if key else b""  # (proto3: an empty string is absent)
    if len(_KEYS) < 4096:
        _KEYS[key] = k
    return k


def key_value(key: str, v: Any) -> bytes:
    """KeyValue: key 1, value 2."""
    return (_KEYS.get(key) or _key(key)) + _field(b"\x12", any_value(v))


def _attributes_py(tag: bytes, attrs: Mapping[str, Any]) -> bytes:
    """``attrs`` as the repeated KeyValue field ``tag`` of a message (the reference of
    _otlp_wire_fast.c)."""
    return b"".join([_field(tag, key_value(k, v)) for k, v in attrs.items()])


# A record's span attributes straight from its dict (agent.records' SPAN_VALUES and
# SPAN_FLAGS), compiled only: in Python, agent.records.span_attributes and `attributes`.
RecordAttributes = Callable[
    [int, dict[str, Any], tuple[tuple[str, str, bool], ...], tuple[tuple[str, str], ...]], bytes
]


def _load_compiled() -> tuple[
    Callable[[bytes, Mapping[str, Any]], bytes], RecordAttributes | None, str
]:
    """The compiled attribute loops (agent/export/_otlp_wire_fast.c; a dict's, the rest
    goes to the reference) or the reference, and which runs (the agent's start-up log)."""
    fast, why_not = compiled.load(
        "agent.export._otlp_wire_fast", compiled.OTLP_WIRE_SOURCE, "PARALLAX_OTLP_WIRE_FAST"
    )
    if fast is None:
        return _attributes_py, None, f"OTLP spans: Python (compiled: {why_not})"
    fast.configure(any_value)
    loop = fast.attributes

    def compiled_attributes(tag: bytes, attrs: Mapping[str, Any]) -> bytes:
        if type(attrs) is dict:
            out: bytes = loop(tag[0], attrs)
            return out
        return _attributes_py(tag, attrs)

    name = Path(fast.__file__ or "?").name
    return compiled_attributes, fast.record_attributes, f"OTLP spans: compiled ({name})"


attributes, record_attributes, ENCODER = _load_compiled()

_SPAN_KIND_SERVER = b"\x30\x02"  # kind 6: SPAN_KIND_SERVER
_STATUS_UNSET = b"\x7a\x00"  # status 15: an empty Status (code UNSET)
_STATUS_ERROR = b"\x7a\x02\x18\x02"  # Status{code 3: STATUS_CODE_ERROR}
# flags 16 (fixed32): SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK, with IS_REMOTE for a parent
# from another process (the browser's, or a proxy's)
_FLAGS_LOCAL_ROOT = b"\x85\x01" + _U32(0x100)
_FLAGS_REMOTE_PARENT = b"\x85\x01" + _U32(0x300)


def span(
    trace_id: str,
    span_id: str,
    trace_state: str,
    parent_span_id: str | None,
    name: str,
    start_ns: int,
    end_ns: int,
    attrs: bytes,
    error: bool,
) -> bytes:
    """A SERVER span (its ids as hex text), children of a remote parent where there is one;
    ``attrs``: its attributes, encoded (``attributes(b"\\x4a", …)``: field 9)."""
    ts = trace_state.encode()
    nm = name.encode()
    return b"".join(
        [
            b"\x0a\x10",  # trace_id 1
            bytes.fromhex(trace_id),
            b"\x12\x08",  # span_id 2
            bytes.fromhex(span_id),
            b"\x1a" + varint(len(ts)) + ts if ts else b"",  # trace_state 3
            b"\x22\x08" + bytes.fromhex(parent_span_id) if parent_span_id else b"",  # parent 4
            b"\x2a" + varint(len(nm)) + nm if nm else b"",  # name 5
            _SPAN_KIND_SERVER,
            b"\x39" + _U64(start_ns) if start_ns else b"",  # start_time_unix_nano 7
            b"\x41" + _U64(end_ns) if end_ns else b"",  # end_time_unix_nano 8
            attrs,
            _STATUS_ERROR if error else _STATUS_UNSET,
            _FLAGS_REMOTE_PARENT if parent_span_id else _FLAGS_LOCAL_ROOT,
        ]
    )


def resource(attrs: Mapping[str, Any]) -> bytes:
    """A Resource message (attributes 1)."""
    return attributes(b"\x0a", attrs)


def scope(name: str) -> bytes:
    """An InstrumentationScope message (name 1)."""
    return _field(b"\x0a", name.encode())


def request(spans: Iterable[tuple[bytes, bytes]], scope_msg: bytes) -> bytes:
    """ExportTraceServiceRequest of ``(resource, span)`` pairs: one ResourceSpans per
    resource, in the order each first appears, with one ScopeSpans of ``scope_msg``. Each
    span is framed by reference (its tag and length beside it in the list, no copy of it
    until the one join)."""
    groups: dict[bytes, list[bytes]] = {}
    small = _SMALL
    for res, sp in spans:
        g = groups.get(res)
        if g is None:
            g = groups[res] = []
        n = len(sp)
        if n < 0x80:
            g += (b"\x12", small[n], sp)  # ScopeSpans.spans 2
        elif n < 0x4000:
            g += (b"\x12", bytes(((n & 0x7F) | 0x80, n >> 7)), sp)
        else:
            g += (b"\x12", varint(n), sp)
    scope_field = _field(b"\x0a", scope_msg)  # ScopeSpans.scope 1
    return b"".join(
        [
            # resource_spans 1: ResourceSpans{resource 1, scope_spans 2}
            _field(b"\x0a", _field(b"\x0a", res) + _field(b"\x12", scope_field + b"".join(g)))
            for res, g in groups.items()
        ]
    )
