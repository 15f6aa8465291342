"""The browser beacon contract (v1 and v2), defined once: the msgspec Structs below.

- v2 (what js_probe sends since issue 31) is v1 plus two optional fields per entry: ``llm``,
  what the probe read of an LLM stream in a known dialect (:class:`Llm`), and ``reason``, why
  an LLM candidate stream has none. v1 stays valid and means what it meant: a v1 entry
  carrying either is refused, as any unknown field was.
  Why both: a probe is cached by CDNs and browsers and runs as long as its tab lives, so old
  probes keep sending v1 for days after a collector upgrade; v2 adds fields only, so one
  decoder (the v2 Entry) reads both without a second code path, and every v1 beacon stays
  exactly as valid as before.

- The collector decodes a beacon with them: ``decode`` takes a whole body in one pass (the
  hot path); ``convert`` checks a parsed document's envelope and then each entry on its
  own, so the valid entries of a partly invalid beacon are still kept.
- ``docs/contracts/beacon.v1.schema.json`` and ``beacon.v2.schema.json`` (v2: what the
  probe's TypeScript tests validate against) are generated from them
  (parallax_contracts/beacon_schema.py: ``python -m parallax_contracts.beacon_schema``
  rewrites the files, ``--check`` compares them, and tests/test_contracts_docs.py fails when
  they differ).

A new field is added here and nowhere else (then the file is regenerated). Where msgspec's
strict decoding and JSON Schema read a document differently, the difference is closed in
the section "What the Structs cannot say" below — the one place for such rules, and the
place for the collector's edge rules on values (what a beacon may carry beyond its types).
"""

from __future__ import annotations

from typing import Annotated, Any, Generic, Literal, TypeVar

import msgspec
from msgspec import Meta

from parallax_contracts import CONTRACTS_DIR

SCHEMA_FILES = {v: CONTRACTS_DIR / f"beacon.v{v}.schema.json" for v in (1, 2)}
SCHEMA_FILE = SCHEMA_FILES[2]  # the version the probe sends
VERSION = 2  # what js_probe sends
VERSIONS = (1, 2)  # what the collector reads
MAX_TOKEN_TIMES = 1024  # Llm.token_ms: as many exact token times as the agent exports
GAP_BUCKETS = 56  # Llm.gap_hist: agent/protocols/streams/gaps.py's buckets
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


class Llm(msgspec.Struct, kw_only=True, forbid_unknown_fields=True, omit_defaults=True):
    """An LLM stream as the probe read it (js_probe/src/llm.ts): the agent's rules
    (agent/protocols/streams) applied to the events the page read. Present only when the
    response spoke a known dialect (recognised from its content type and first events); a
    stream in no dialect (a CSV download) has no ``llm``. Absent fields were not measured."""

    dialect: Annotated[
        Literal["anthropic.messages", "openai.responses", "openai.chat", "ollama"],
        Meta(description="The stream's dialect (the agent's parallax.llm.dialect names)."),
    ]
    first_token_ms: Annotated[
        _Ms,
        Meta(
            description="Arrival of the first answer token (text or a tool call; not the "
            "role-only delta, message_start, a heartbeat or reasoning): user TTFT = "
            "first_token_ms − request_start_ms."
        ),
    ] = _N
    first_output_ms: Annotated[
        _Ms,
        Meta(
            description="Arrival of the first output token of any kind, reasoning included "
            "(earlier than first_token_ms when the model thought first)."
        ),
    ] = _N
    token_ms: Annotated[
        list[_Ms],
        Meta(
            max_length=MAX_TOKEN_TIMES,
            description="Arrival of each output token event (answer and reasoning), the first "
            "1024: their gaps are the first 1023 inter-token gaps, exactly.",
        ),
    ] = _N
    gap_hist: Annotated[
        list[_U32],
        Meta(
            min_length=GAP_BUCKETS,
            max_length=GAP_BUCKETS,
            description="Every inter-token gap after the 1024th token (those token_ms cannot "
            "give), counted in the agent's log buckets: bucket i = ⌊2·log2(gap in µs)⌋ "
            "(0 for gaps under 1 µs), the last one open-ended. Absent: no such gap.",
        ),
    ] = _N
    tokens: Annotated[
        _U32,
        Meta(
            description="Output tokens: the stream's own usage when it states it (the last "
            "statement), else its output token events."
        ),
    ]
    tokens_source: Annotated[
        Literal["usage", "events"],
        Meta(description="Where tokens comes from."),
    ]
    end: Annotated[
        Literal["complete", "server_cut", "client_aborted", "error"],
        Meta(
            description="complete: the dialect's final event arrived (whatever the connection "
            "did after); error: an error event inside the stream; client_aborted: the page "
            "cancelled or closed it, or left, before the final event; server_cut: it ended "
            "without one. Absent: still open when sent."
        ),
    ] = _N
    bad_events: Annotated[
        _U32,
        Meta(
            description="Events of the dialect the probe could not read: not JSON, of "
            "unexpected shape, or over 64 KiB (not counted as tokens)."
        ),
    ] = _N


class EntryV1(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One traced request: the measurement model's browser side (beacon v1)."""

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
            description="Paint after the first chunk was shown (v2, on an entry with llm: "
            "after its first answer token): visible TTFT = rendered_ms − request_start_ms."
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


class Entry(EntryV1, kw_only=True, forbid_unknown_fields=True):
    """One traced request (beacon v2: v1's fields, ``llm`` and ``reason``). The collector
    decodes the entries of both versions as this; a v1 entry has neither."""

    llm: Annotated[
        Llm,
        Meta(description="The response was an LLM stream in a known dialect: its tokens."),
    ] = _N
    reason: Annotated[
        Literal["llm_unread", "llm_overflow"],
        Meta(
            description="Why a measurement the entry would carry is absent. llm_unread: an "
            "LLM candidate stream (an event stream or NDJSON body, an EventSource) was not "
            "read as tokens: the probe's token reader (parallax-llm.min.js, loaded on the "
            "page's first such stream) could not load (404, CSP, network) or had not loaded "
            "when the entry was sent; its chunk times stand. llm_overflow: the stream "
            "outgrew what the probe holds for the reader while it loads (128 KiB in all)."
        ),
    ] = _N


E = TypeVar("E")


class Beacon(msgspec.Struct, Generic[E], kw_only=True, forbid_unknown_fields=True, tag_field="v"):
    """What js_probe sends to POST /v1/beacons (Content-Type text/plain, so no CORS
    preflight). Every time is milliseconds relative to time_origin (performance.timeOrigin),
    as a float; durations end _ms. Unknown fields are rejected: a new field means a new
    version, ``v`` (BeaconV1, BeaconV2)."""

    # ``Beacon[Entry]`` is a whole valid beacon; ``Beacon[Any]`` checks the envelope only,
    # leaving the entries as they came (convert() then takes them one by one).
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


class BeaconV1(Beacon[E], Generic[E], tag=1):
    """What js_probe sends to POST /v1/beacons (Content-Type text/plain, so no CORS
    preflight). Every time is milliseconds relative to time_origin (performance.timeOrigin),
    as a float; durations end _ms. Unknown fields are rejected: a new field means a new
    version (v2 adds an entry's llm)."""


class BeaconV2(Beacon[E], Generic[E], tag=2):
    """What js_probe sends to POST /v1/beacons (Content-Type text/plain, so no CORS
    preflight). Every time is milliseconds relative to time_origin (performance.timeOrigin),
    as a float; durations end _ms. Unknown fields are rejected: a new field means a new
    version. v2 is v1 plus an entry's llm: what the probe read of an LLM stream."""


_decode = msgspec.json.Decoder(BeaconV1[Entry] | BeaconV2[Entry]).decode
_ENVELOPE: Any = BeaconV1[Any] | BeaconV2[Any]
_V2_ONLY = ("llm", "reason")  # Entry's fields that EntryV1 lacks


def _v1_fault(e: Entry) -> str | None:
    """msgspec's message for a v1 entry carrying a v2 field, else None."""
    for k in _V2_ONLY:
        if getattr(e, k) is not None:
            return f"Object contains unknown field `{k}` (beacon v1)"
    return None


def version_of(b: Beacon[Any]) -> int:
    return 1 if isinstance(b, BeaconV1) else 2


def decode(body: bytes) -> Beacon[Entry]:
    """A whole beacon, every entry valid, in one pass. Raises msgspec.DecodeError (its
    subclass ValidationError when the JSON is well-formed) for anything else — including
    documents ``convert`` accepts (see below): the caller then parses the JSON and converts.
    A body nested too deep raises RecursionError (msgspec's own)."""
    if _NUL_ESCAPE in body:  # the string rule below: convert() says which value
        raise msgspec.DecodeError("a string holds NUL (\\u0000)")
    b: Beacon[Entry] = _decode(body)
    if isinstance(b, BeaconV1):
        for e in b.entries:
            fault = _v1_fault(e)
            if fault:
                raise msgspec.ValidationError(fault)  # convert() says which entry
    return b


def convert(doc: Any) -> tuple[Beacon[Any], list[Entry | str]]:
    """A parsed JSON document checked as a beacon: its envelope (raises
    msgspec.ValidationError when that is invalid: the whole beacon is unusable), its entries
    as they came, and per entry the Entry or why it is invalid (msgspec's message, its path
    under ``$.entries[i]``). Judges every document as ``decode`` would, with the differences
    below closed."""
    env: Beacon[Any] = msgspec.convert(_as_json_schema_reads(doc, _ENVELOPE_INTS), _ENVELOPE)
    fault = _string_fault({k: v for k, v in doc.items() if k != "entries"}, "$")
    if fault:
        raise msgspec.ValidationError(fault)
    v = version_of(env)
    checked = [check_entry(raw, i, v) for i, raw in enumerate(env.entries)]
    return env, checked


def check_entry(raw: Any, index: int = 0, version: int = VERSION) -> Entry | str:
    """One parsed entry of a beacon of ``version`` as an Entry, or msgspec's message why it
    is not one (its path under ``$.entries[index]``)."""
    try:
        entry = msgspec.convert(_entry_as_json_schema_reads(raw), Entry)
    except msgspec.ValidationError as e:
        return _under(f"$.entries[{index}]", str(e))
    fault = _v1_fault(entry) if version == 1 else None
    if fault:
        return f"{fault} - at `$.entries[{index}]`"
    return _string_fault(raw, f"$.entries[{index}]") or entry


def errors(doc: Any) -> list[str]:
    """One line per violation (msgspec's message and where), empty when ``doc`` (a parsed
    JSON value) is a valid beacon (v1 or v2)."""
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
# (beacon_schema.json_schema() closes the other direction: `\Z` published as `$`, no null defaults.)
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


def _int_list_fields(cls: type[msgspec.Struct]) -> frozenset[str]:
    """The fields that are lists of integers."""
    info = msgspec.inspect.type_info(cls)
    assert isinstance(info, msgspec.inspect.StructType)

    def bare(t: msgspec.inspect.Type) -> msgspec.inspect.Type:
        return t.type if isinstance(t, msgspec.inspect.Metadata) else t

    out = set()
    for f in info.fields:
        t = bare(f.type)
        if isinstance(t, msgspec.inspect.ListType) and isinstance(
            bare(t.item_type), msgspec.inspect.IntType
        ):
            out.add(f.encode_name)
    return frozenset(out)


# The tag ``v`` is no field of the Structs, but an integer all the same.
_ENVELOPE_INTS = _int_fields(Beacon[Any]) | {"v"}
_ENTRY_INTS = _int_fields(Entry)
_LLM_INTS = _int_fields(Llm)
_LLM_INT_LISTS = _int_list_fields(Llm)


def _entry_as_json_schema_reads(raw: Any) -> Any:
    """An entry's integer fields as JSON Schema reads them, its ``llm`` object's too."""
    out = _as_json_schema_reads(raw, _ENTRY_INTS)
    llm = out.get("llm") if type(out) is dict else None
    if type(llm) is not dict:
        return out
    fixed = _as_json_schema_reads(llm, _LLM_INTS)
    for k in _LLM_INT_LISTS:
        xs = fixed.get(k)
        if type(xs) is list and any(type(x) is float and x.is_integer() for x in xs):
            fixed = {**fixed, k: [int(x) if type(x) is float and x.is_integer() else x for x in xs]}
    return out if fixed is llm else {**out, "llm": fixed}


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
NO_NUL_PATTERN = "^[^\\u0000]*$"


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
