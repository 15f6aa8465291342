"""The browser beacon contract (v1), defined once: the msgspec Structs below.

- The collector decodes a beacon with them: ``decode`` takes a whole body in one pass (the
  hot path); ``convert`` checks a parsed document's envelope and then each entry on its
  own, so the valid entries of a partly invalid beacon are still kept.
- ``docs/contracts/beacon.v1.schema.json`` — what the probe's TypeScript tests validate
  against — is generated from them by ``json_schema()``:
  ``python -m parallax_contracts.beacon`` rewrites the file, ``--check`` compares it, and
  tests/test_contracts_docs.py fails when the two differ.

A new field is added here and nowhere else (then the file is regenerated). Where msgspec's
strict decoding and JSON Schema read a document differently, the difference is closed in
the section "What the Structs cannot say" below — the one place for such rules, and the
place for the collector's edge rules on values (what a beacon may carry beyond its types).
"""

from __future__ import annotations

import argparse
import json
import sys
from functools import cache
from typing import Annotated, Any, Generic, Literal, TypeVar

import msgspec
from msgspec import Meta

from parallax_contracts import CONTRACTS_DIR

SCHEMA_FILE = CONTRACTS_DIR / "beacon.v1.schema.json"
VERSION = 1
U32_MAX = 4294967295
SAFE_INT = 9007199254740991  # Number.MAX_SAFE_INTEGER: the largest integer JS sends exactly
MS_MAX = 10000000000.0
UNIX_MS_MAX = 8.64e15  # the latest instant a JavaScript Date holds (year 275760)

# An absent optional field reads None. The annotations say the value's type, not `| None`:
# an explicit null is not in the contract, so msgspec must refuse it (and the schema say so).
_N: Any = None
_Ms = Annotated[
    float,
    Meta(
        ge=0,
        le=MS_MAX,
        description="Milliseconds relative to time_origin: finite, at most 1e10 (115 days of "
        "page life).",
    ),
]
_U32 = Annotated[int, Meta(ge=0, le=U32_MAX)]


class ServerTiming(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """One Server-Timing metric of the response, as the browser reports it."""

    name: Annotated[str, Meta(max_length=64)]
    dur_ms: Annotated[float, Meta(ge=0, le=MS_MAX)] = _N
    desc: Annotated[str, Meta(max_length=256)] = _N


class Entry(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One traced request: the measurement model's browser side."""

    # Patterns end `\Z`: msgspec matches with Python's re.search, where `$` also matches
    # before a final newline; json_schema() publishes `$`, which in ECMA-262 (ajv) does not.
    trace_id: Annotated[
        str,
        Meta(
            pattern=r"^[0-9a-f]{32}\Z", description="Trace id sent in traceparent (not all zero)."
        ),
    ]
    span_id: Annotated[
        str,
        Meta(
            pattern=r"^[0-9a-f]{16}\Z",
            description="The browser's span id: the parent id in the traceparent the server "
            "received.",
        ),
    ]
    sampled: bool = _N
    kind: Literal["fetch", "xhr", "eventsource", "websocket", "navigation"]
    seq: Annotated[
        _U32,
        Meta(
            description="WebSocket exchange number (1 = first message the page sent after "
            "open); 0 or absent otherwise."
        ),
    ] = _N
    method: Annotated[str, Meta(pattern=r"^[A-Z]{1,16}\Z")] = _N
    url: Annotated[
        str, Meta(max_length=2048, description="Request URL without query string or fragment.")
    ] = _N
    status: Annotated[
        int,
        Meta(ge=0, le=999, description="HTTP status (0 when the request failed or is opaque)."),
    ] = _N
    start_ms: Annotated[
        _Ms, Meta(description="When the app started the request (the probe's own timestamp).")
    ]
    request_start_ms: Annotated[
        _Ms,
        Meta(
            description="t0: Resource Timing requestStart (or the probe's send time when coarse)."
        ),
    ] = _N
    response_start_ms: Annotated[
        _Ms,
        Meta(
            description="t3: Resource Timing responseStart (or when the probe saw the response "
            "headers when coarse)."
        ),
    ] = _N
    response_end_ms: Annotated[_Ms, Meta(description="Last byte of the response (stream end).")] = (
        _N
    )
    dns_ms: Annotated[_Ms, Meta(description="DNS lookup duration (new connections only).")] = _N
    connect_ms: Annotated[
        _Ms, Meta(description="TCP connect duration including TLS (new connections only).")
    ] = _N
    tls_ms: Annotated[
        _Ms, Meta(description="TLS handshake duration (new HTTPS connections only).")
    ] = _N
    first_chunk_ms: Annotated[
        _Ms,
        Meta(
            description="Arrival of the first body chunk/message: user TTFT = first_chunk_ms − "
            "request_start_ms."
        ),
    ] = _N
    chunk_ms: Annotated[
        list[_Ms],
        Meta(max_length=256, description="Arrival time of each chunk/message, the first 256."),
    ] = _N
    chunks: Annotated[
        _U32, Meta(description="All chunks/messages received (may exceed chunk_ms).")
    ] = _N
    rendered_ms: Annotated[
        _Ms,
        Meta(
            description="Paint after the first chunk was shown: visible TTFT = rendered_ms − "
            "request_start_ms."
        ),
    ] = _N
    coarse: Annotated[
        bool,
        Meta(
            description="request/response start are the probe's own timestamps (no Resource "
            "Timing, e.g. cross-origin without Timing-Allow-Origin)."
        ),
    ] = _N
    chunks_coarse: Annotated[
        bool,
        Meta(description="Chunk times are throttled by the browser (XHR progress, ~50 ms)."),
    ] = _N
    transfer_size: Annotated[int, Meta(ge=0, le=SAFE_INT)] = _N
    protocol: Annotated[
        str,
        Meta(max_length=16, description="Resource Timing nextHopProtocol, e.g. http/1.1, h2."),
    ] = _N
    server_timing: Annotated[list[ServerTiming], Meta(max_length=16)] = _N
    error: Annotated[
        str,
        Meta(
            max_length=64,
            description="Failure class: network, abort, timeout (no message text).",
        ),
    ] = _N
    hidden: Annotated[
        bool,
        Meta(description="The page was hidden during the request (no render sample)."),
    ] = _N


E = TypeVar("E")


class Beacon(msgspec.Struct, Generic[E], kw_only=True, forbid_unknown_fields=True):
    """What js_probe sends to POST /v1/beacons (Content-Type text/plain, so no CORS
    preflight). Every time is milliseconds relative to time_origin (performance.timeOrigin),
    as a float; durations end _ms. Unknown fields are rejected: a new field means a new
    version."""

    # ``Beacon[Entry]`` is a whole valid beacon; ``Beacon[Any]`` checks the envelope only,
    # leaving the entries as they came (convert() then takes them one by one).
    v: Annotated[Literal[1], Meta(description="Beacon format version.")]
    site: Annotated[
        str,
        Meta(pattern=r"^[A-Za-z0-9._-]{1,64}\Z", description="Site key given to Parallax.init."),
    ]
    session: Annotated[
        str,
        Meta(
            pattern=r"^[A-Za-z0-9_-]{8,64}\Z",
            description="Browser session id (random; rotates after inactivity).",
        ),
    ]
    page: Annotated[str, Meta(max_length=2048, description="Page path (no query string).")] = _N
    time_origin: Annotated[
        float,
        Meta(
            ge=0,
            le=UNIX_MS_MAX,
            description="performance.timeOrigin: Unix epoch milliseconds of the page's time zero.",
        ),
    ]
    clock_drift_ms: Annotated[
        float,
        Meta(
            ge=-MS_MAX,
            le=MS_MAX,
            description="Date.now() − (time_origin + performance.now()) when sent: how far the "
            "monotonic page clock has drifted from the wall clock (sleep/resume).",
        ),
    ] = _N
    sent_ms: Annotated[
        float, Meta(ge=0, le=MS_MAX, description="performance.now() when the beacon was sent.")
    ] = _N
    dropped: Annotated[
        _U32,
        Meta(
            description="Entries dropped from the probe's bounded queue since the previous beacon."
        ),
    ] = _N
    sdk: Annotated[
        str,
        Meta(max_length=64, description="Probe name and version, e.g. parallax-js/0.1.0."),
    ] = _N
    entries: Annotated[list[E], Meta(max_length=500)]


_decode = msgspec.json.Decoder(Beacon[Entry]).decode


def decode(body: bytes) -> Beacon[Entry]:
    """A whole beacon, every entry valid, in one pass. Raises msgspec.DecodeError (its
    subclass ValidationError when the JSON is well-formed) for anything else — including
    documents ``convert`` accepts (see below): the caller then parses the JSON and converts.
    A body nested too deep raises RecursionError (msgspec's own)."""
    if _NUL_ESCAPE in body:  # the string rule below: convert() says which value
        raise msgspec.DecodeError("a string holds NUL (\\u0000)")
    return _decode(body)


def convert(doc: Any) -> tuple[Beacon[Any], list[Entry | str]]:
    """A parsed JSON document checked as a beacon: its envelope (raises
    msgspec.ValidationError when that is invalid: the whole beacon is unusable), its entries
    as they came, and per entry the Entry or why it is invalid (msgspec's message, its path
    under ``$.entries[i]``). Judges every document as ``decode`` would, with the differences
    below closed."""
    env = msgspec.convert(_as_json_schema_reads(doc, _ENVELOPE_INTS), Beacon[Any])
    fault = _string_fault({k: v for k, v in doc.items() if k != "entries"}, "$")
    if fault:
        raise msgspec.ValidationError(fault)
    checked = [check_entry(raw, i) for i, raw in enumerate(env.entries)]
    return env, checked


def check_entry(raw: Any, index: int = 0) -> Entry | str:
    """One parsed entry as an Entry, or msgspec's message why it is not one (its path
    under ``$.entries[index]``)."""
    try:
        entry = msgspec.convert(_as_json_schema_reads(raw, _ENTRY_INTS), Entry)
    except msgspec.ValidationError as e:
        return _under(f"$.entries[{index}]", str(e))
    return _string_fault(raw, f"$.entries[{index}]") or entry


def errors(doc: Any) -> list[str]:
    """One line per violation (msgspec's message and where), empty when ``doc`` (a parsed
    JSON value) is a valid v1 beacon."""
    try:
        _, checked = convert(doc)
    except msgspec.ValidationError as e:
        return [str(e)]
    return [c for c in checked if type(c) is str]


def _under(prefix: str, message: str) -> str:
    # msgspec ends a message with " - at `$.path`" (nothing when the value itself is wrong).
    at = " - at `$"
    if at in message:
        return message.replace(at, f" - at `{prefix}", 1)
    return f"{message} - at `{prefix}`"


# --- What the Structs cannot say --------------------------------------------------------
# (json_schema() below closes the other direction: `\Z` published as `$`, no null defaults.)
# JSON Schema reads a number with no fractional part as an integer (1.0 is the integer 1,
# as in JavaScript, where the two are one value); msgspec's strict decoding refuses a float
# for an int field. convert() hands such values to msgspec as ints, for the integer fields
# only (derived from the Structs: a lax msgspec would also take "1" for 1). decode() does
# not: a beacon written that way is not what the probe sends, and takes convert()'s path.
def _int_fields(cls: type[msgspec.Struct]) -> frozenset[str]:
    def is_int(t: msgspec.inspect.Type) -> bool:
        if isinstance(t, msgspec.inspect.Metadata):
            return is_int(t.type)
        if isinstance(t, msgspec.inspect.LiteralType):
            return all(type(v) is int for v in t.values)
        return isinstance(t, msgspec.inspect.IntType)

    info = msgspec.inspect.type_info(cls)
    assert isinstance(info, msgspec.inspect.StructType)
    return frozenset(f.encode_name for f in info.fields if is_int(f.type))


_ENVELOPE_INTS = _int_fields(Beacon[Any])
_ENTRY_INTS = _int_fields(Entry)


def _as_json_schema_reads(obj: Any, int_fields: frozenset[str]) -> Any:
    if type(obj) is not dict:
        return obj
    out: dict[str, Any] | None = None
    for k in int_fields:
        v = obj.get(k)
        if type(v) is float and v.is_integer():
            if out is None:
                out = dict(obj)
            out[k] = int(v)
    return obj if out is None else out


# Strings: no NUL and no lone surrogate, in any field. A NUL is in no URL, name or failure
# class a browser reports, and tools that read C strings cut the value at it; a lone
# surrogate cannot be encoded as UTF-8, so the store would refuse the row (and, before this
# rule, the insert of every row batched with it). msgspec's decoder refuses lone surrogates
# itself, and decode() sends a body with a NUL escape to convert(), which checks every
# string of the parsed document (json's fallback reads both). The schema says "no NUL" as a
# pattern on each string without one (json_schema()); JSON text cannot carry a lone
# surrogate that ECMA-262 or Rust validators would read as one.
_NUL_ESCAPE = b"\\u0000"  # a NUL can only be written so in JSON (raw control characters
# are invalid); an escaped backslash before "u0000" also matches: convert() then decides.
_NO_NUL = "^[^\\u0000]*$"


def _string_fault(value: Any, path: str) -> str | None:
    """msgspec-style message for the first string under ``value`` that holds a NUL or a
    lone surrogate, else None."""
    if type(value) is str:
        if "\x00" in value:
            return f"String holds a NUL character - at `{path}`"
        if not value.isascii():
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                return f"String holds a lone surrogate - at `{path}`"
        return None
    if type(value) is dict:
        for k, v in value.items():
            fault = _string_fault(v, f"{path}.{k}")
            if fault:
                return fault
    elif type(value) is list:
        for i, v in enumerate(value):
            fault = _string_fault(v, f"{path}[{i}]")
            if fault:
                return fault
    return None


def json_schema() -> dict[str, Any]:
    """The JSON Schema (2020-12) of a v1 beacon, as published in docs/contracts: msgspec's,
    with the root inlined, the anchors written for ECMA-262, descriptions on one line and
    no `default: null` (an absent field is not a null one: null is refused)."""
    generated = msgspec.json.schema(Beacon[Entry])
    defs: dict[str, Any] = generated["$defs"]
    root = defs.pop(generated["$ref"].rsplit("/", 1)[1])
    out: dict[str, Any] = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://parallax.dev/schemas/beacon.v1.json",
        **root,
        "title": "Parallax browser beacon, version 1",
        "$defs": defs,
    }
    published: dict[str, Any] = _published(out)
    return published


def _published(node: Any) -> Any:
    if isinstance(node, list):
        return [_published(x) for x in node]
    if not isinstance(node, dict):
        return node
    out = {}
    for k, v in node.items():
        if k == "default" and v is None:
            continue
        if k == "description":  # docstrings wrap
            out[k] = " ".join(v.split())
        elif k == "pattern":
            assert v.startswith("^") and v.endswith(r"\Z") and v.count("\\Z") == 1, v
            out[k] = v[:-2] + "$"
        else:
            out[k] = _published(v)
    if out.get("type") == "string" and "pattern" not in out:
        out["pattern"] = _NO_NUL  # the string rule (above); patterned fields exclude NUL
    return out


def schema_text() -> str:
    return json.dumps(json_schema(), indent=2, ensure_ascii=False) + "\n"


@cache
def schema() -> dict[str, Any]:
    """The published schema file, as the probe's tests read it."""
    loaded: dict[str, Any] = json.loads(SCHEMA_FILE.read_text())
    return loaded


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m parallax_contracts.beacon",
        description=f"Write {SCHEMA_FILE.name} from the Structs (the beacon's one definition).",
    )
    p.add_argument("--check", action="store_true", help="exit 1 if the file is out of date")
    args = p.parse_args(argv)
    text = schema_text()
    current = SCHEMA_FILE.read_text() if SCHEMA_FILE.exists() else ""
    if args.check:
        if current != text:
            print(f"{SCHEMA_FILE} is out of date: run python -m parallax_contracts.beacon")
            return 1
        return 0
    if current != text:
        SCHEMA_FILE.write_text(text)
        print(f"wrote {SCHEMA_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
