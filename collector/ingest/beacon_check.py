"""A hand-written ``is_valid`` for the beacon v1 JSON Schema, for the ingest hot path.

The schema (docs/contracts/beacon.v1.schema.json, parallax_contracts.beacon) stays the
contract: this module answers the same yes/no for every JSON document (tests/collector/
test_beacon_check.py checks it against the compiled schema validator on hypothesis-generated
beacons and on the bad-input cases), and a document it refuses is explained by the schema's
own validator. Why by hand: a generic validator converts every value of the document to its
own representation first (Python → Rust for jsonschema_rs, ≈ 5 µs per 13-field entry);
here each value is type-checked where it lies.

The JSON Schema rules this relies on: ``number`` is an int or a float but not a bool;
``integer`` is also a float with no fractional part (2020-12: 1.0 is an integer); ``const``
and ``enum`` compare numbers by value, never a bool with a number; ``maxLength`` counts code
points (Python's ``len``); ``pattern`` is unanchored but every pattern here is ``^…$``, which
in ECMA-262 (and the compiled validator) does not match before a trailing newline — hence
``fullmatch`` on the pattern without its anchors.
"""

from __future__ import annotations

import re
from typing import Any

_SITE = re.compile(r"[A-Za-z0-9._-]{1,64}").fullmatch
_SESSION = re.compile(r"[A-Za-z0-9_-]{8,64}").fullmatch
_TRACE = re.compile(r"[0-9a-f]{32}").fullmatch
_SPAN = re.compile(r"[0-9a-f]{16}").fullmatch
_METHOD = re.compile(r"[A-Z]{1,16}").fullmatch
_KINDS = frozenset(("fetch", "xhr", "eventsource", "websocket", "navigation"))
# The schema's numeric bounds (also the typed decoder's, collector/ingest/beacons.py).
U32_MAX = 4294967295
SAFE_INT = 9007199254740991
MS_MAX = 10000000000.0

_ENVELOPE_KEYS = frozenset(
    ("v", "site", "session", "page", "time_origin", "clock_drift_ms", "sent_ms", "dropped",
     "sdk", "entries")
)  # fmt: skip
_TIMING_KEYS = frozenset(("name", "dur_ms", "desc"))

# Entry property → how it is checked (an int switch: a call per value costs more than the check).
_MS, _BOOL, _STR_MAX, _UINT32, _TRACE_ID, _SPAN_ID, _KIND, _METHOD_S, _STATUS = range(9)
_CHUNKS_ARR, _SIZE, _TIMINGS = 9, 10, 11
_ENTRY: dict[str, tuple[int, int]] = {
    "trace_id": (_TRACE_ID, 0),
    "span_id": (_SPAN_ID, 0),
    "sampled": (_BOOL, 0),
    "kind": (_KIND, 0),
    "seq": (_UINT32, 0),
    "method": (_METHOD_S, 0),
    "url": (_STR_MAX, 2048),
    "status": (_STATUS, 0),
    "start_ms": (_MS, 0),
    "request_start_ms": (_MS, 0),
    "response_start_ms": (_MS, 0),
    "response_end_ms": (_MS, 0),
    "dns_ms": (_MS, 0),
    "connect_ms": (_MS, 0),
    "tls_ms": (_MS, 0),
    "first_chunk_ms": (_MS, 0),
    "chunk_ms": (_CHUNKS_ARR, 0),
    "chunks": (_UINT32, 0),
    "rendered_ms": (_MS, 0),
    "coarse": (_BOOL, 0),
    "chunks_coarse": (_BOOL, 0),
    "transfer_size": (_SIZE, 0),
    "protocol": (_STR_MAX, 16),
    "server_timing": (_TIMINGS, 0),
    "error": (_STR_MAX, 64),
    "hidden": (_BOOL, 0),
}
_REQUIRED = ("trace_id", "span_id", "kind", "start_ms")


def _is_number(v: Any) -> bool:
    t = type(v)
    return t is float or t is int


def _is_integer(v: Any) -> bool:
    t = type(v)
    return t is int or (t is float and v.is_integer())


def is_valid(doc: Any) -> bool:
    """True iff ``doc`` (a parsed JSON value) is valid against beacon.v1.schema.json."""
    if type(doc) is not dict or not doc.keys() <= _ENVELOPE_KEYS:
        return False
    try:
        v, site, session, origin, entries = (
            doc["v"], doc["site"], doc["session"], doc["time_origin"], doc["entries"]
        )  # fmt: skip
    except KeyError:
        return False
    if not (_is_number(v) and v == 1):
        return False
    if type(site) is not str or not _SITE(site):
        return False
    if type(session) is not str or not _SESSION(session):
        return False
    if not (_is_number(origin) and origin >= 0):
        return False
    if type(entries) is not list or len(entries) > 500:
        return False
    if len(doc) > 5 and not _optional_envelope_ok(doc):
        return False
    return all(entry_is_valid(e) for e in entries)


def _optional_envelope_ok(doc: dict[str, Any]) -> bool:
    if "page" in doc:
        x = doc["page"]
        if type(x) is not str or len(x) > 2048:
            return False
    if "sdk" in doc:
        x = doc["sdk"]
        if type(x) is not str or len(x) > 64:
            return False
    if "clock_drift_ms" in doc and not _is_number(doc["clock_drift_ms"]):
        return False
    if "sent_ms" in doc:
        x = doc["sent_ms"]
        if not (_is_number(x) and x >= 0):
            return False
    if "dropped" in doc:
        x = doc["dropped"]
        if not (_is_integer(x) and 0 <= x <= U32_MAX):
            return False
    return True


def entry_is_valid(e: Any) -> bool:
    """True iff ``e`` is valid against the schema's ``$defs/entry``."""
    if type(e) is not dict:
        return False
    for k in _REQUIRED:
        if k not in e:
            return False
    entry = _ENTRY
    for k, v in e.items():
        rule = entry.get(k)
        if rule is None:  # additionalProperties: false
            return False
        c = rule[0]
        t = type(v)
        if c == _MS:
            if not ((t is float or t is int) and 0 <= v <= MS_MAX):
                return False
        elif c == _TRACE_ID:
            if t is not str or not _TRACE(v):
                return False
        elif c == _SPAN_ID:
            if t is not str or not _SPAN(v):
                return False
        elif c == _KIND:
            if t is not str or v not in _KINDS:
                return False
        elif c == _BOOL:
            if t is not bool:
                return False
        elif c == _STR_MAX:
            if t is not str or len(v) > rule[1]:
                return False
        elif c == _METHOD_S:
            if t is not str or not _METHOD(v):
                return False
        elif c == _STATUS:
            if not ((t is int or (t is float and v.is_integer())) and 0 <= v <= 999):
                return False
        elif c == _UINT32:
            if not ((t is int or (t is float and v.is_integer())) and 0 <= v <= U32_MAX):
                return False
        elif c == _CHUNKS_ARR:
            if t is not list or len(v) > 256:
                return False
            for x in v:
                tx = type(x)
                if not ((tx is float or tx is int) and 0 <= x <= MS_MAX):
                    return False
        elif c == _SIZE:
            if not ((t is int or (t is float and v.is_integer())) and 0 <= v <= SAFE_INT):
                return False
        elif not timings_ok(v):  # _TIMINGS
            return False
    return True


def timings_ok(v: Any) -> bool:
    if type(v) is not list or len(v) > 16:
        return False
    for st in v:
        if type(st) is not dict or "name" not in st or not st.keys() <= _TIMING_KEYS:
            return False
        name = st["name"]
        if type(name) is not str or len(name) > 64:
            return False
        if "dur_ms" in st:
            d = st["dur_ms"]
            if not (_is_number(d) and d >= 0):
                return False
        if "desc" in st:
            d = st["desc"]
            if type(d) is not str or len(d) > 256:
                return False
    return True
