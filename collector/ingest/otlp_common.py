"""What the OTLP/HTTP decoders share (traces: ``otlp``, metrics: ``otlp_metrics``): reading a
body in either encoding, AnyValue → Python, the lenient int and number reads, the
partial-success answer."""

from __future__ import annotations

import base64
import json
import math
from typing import Any, TypeVar

from google.protobuf import json_format  # type: ignore[import-untyped]
from google.protobuf.message import DecodeError  # type: ignore[import-untyped]

from collector.ingest.common import BadRequestError

_ID_KEYS = frozenset(("traceId", "spanId", "parentSpanId", "trace_id", "span_id", "parent_span_id"))


def any_value(v: Any) -> Any:
    """An AnyValue as Python: None when empty, lists and dicts for arrays and kvlists,
    bytes as hex."""
    which = v.WhichOneof("value")
    if which is None:
        return None
    if which == "array_value":
        return [any_value(x) for x in v.array_value.values]
    if which == "kvlist_value":
        return {kv.key: any_value(kv.value) for kv in v.kvlist_value.values}
    if which == "bytes_value":
        return v.bytes_value.hex()
    return getattr(v, which)


def as_int(x: Any) -> int | None:
    """An int attribute as sent by a lenient source: an int, a float with no fraction, a
    digit string; else None (bools are not ints here)."""
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


def as_number(x: Any, lo: float, hi: float) -> float | None:
    """A finite double attribute (an int is taken too) within [lo, hi]; else None: NaN, ±inf, a
    string, a bool, a value out of its range — absent, never a made-up number."""
    if type(x) is float:
        return x if lo <= x <= hi and math.isfinite(x) else None
    if type(x) is int:  # int_value is an int64: float() of it is finite
        return float(x) if lo <= x <= hi else None
    return None


def as_str(v: Any) -> str:
    """An attribute value for a ``Map(…, String)`` column: strings as they are, the rest as
    JSON writes them."""
    return v if isinstance(v, str) else json.dumps(v)


def _hex_ids_to_b64(node: Any) -> None:
    """OTLP/JSON writes ids as hex; protobuf's JSON mapping wants base64 for bytes."""
    if isinstance(node, dict):
        for k, v in node.items():
            if k in _ID_KEYS:
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


M = TypeVar("M")


def decode(body: bytes, json_body: bool, msg: M) -> M:
    """Fill the empty request message ``msg`` from an OTLP/HTTP body (protobuf, or OTLP JSON
    with hex ids); a body it cannot read raises BadRequestError (400) with one line."""
    if json_body:
        try:
            _decode_json(body, msg)
        except RecursionError:  # json, the id walk or ParseDict: no OTLP message nests so
            raise BadRequestError("malformed JSON: nested too deep") from None
    else:
        try:
            # (upb stops at its own depth limit: a DecodeError)
            msg.ParseFromString(body)  # type: ignore[attr-defined]
        except DecodeError as e:
            raise BadRequestError(f"malformed protobuf: {e}") from None
    return msg


def _decode_json(body: bytes, msg: Any) -> None:
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError) as e:
        raise BadRequestError(f"malformed JSON: {e}") from None
    if not isinstance(doc, dict):
        raise BadRequestError("OTLP JSON body must be an object")
    _hex_ids_to_b64(doc)
    try:
        json_format.ParseDict(doc, msg, ignore_unknown_fields=True)
    except (json_format.ParseError, ValueError, TypeError) as e:
        raise BadRequestError(f"malformed OTLP JSON: {str(e).splitlines()[0][:200]}") from None


def answer(
    resp: Any, rejected_field: str, rejected: int, message: str, json_body: bool
) -> tuple[bytes, str]:
    """An Export*ServiceResponse in the request's encoding: (body, content type); partial
    success (``rejected_field`` = the count, and the message) when something was rejected."""
    if rejected:
        setattr(resp.partial_success, rejected_field, rejected)
        resp.partial_success.error_message = message
    if json_body:
        return json_format.MessageToJson(resp, indent=None).encode(), "application/json"
    return resp.SerializeToString(), "application/x-protobuf"
