"""The beacon decoder (the Structs of parallax_contracts.beacon, and the collector's two
ways through them) accepts and rejects exactly what the published JSON Schema generated from
them says: hypothesis-generated beacons — valid ones and ones with values at and beyond
every bound, wrong types, integers written as floats, nulls, extra and missing keys — are
judged by the decoder and by compiled validators of docs/contracts/beacon.v1.schema.json and
beacon.v2.schema.json (jsonschema_rs: ECMA-262 patterns, as the probe's ajv reads them; a
beacon is valid when one of the two versions says so), per beacon and per entry, and the
answers must agree. The whole-body fast path must give the same rows as the
entry-by-entry path."""

from __future__ import annotations

import json
import re
from typing import Any

import jsonschema_rs
import msgspec
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collector.ingest import beacons
from collector.ingest.common import BadRequestError
from collector.store import schema
from parallax_contracts import beacon, beacon_schema
from parallax_contracts.beacon import Beacon, Entry


class _EitherVersion:
    """Valid as beacon v1 or as beacon v2 (what the collector reads)."""

    def __init__(self) -> None:
        self.by_version = [
            jsonschema_rs.validator_for(beacon_schema.schema(v)) for v in beacon.VERSIONS
        ]

    def is_valid(self, doc: Any) -> bool:
        return any(rs.is_valid(doc) for rs in self.by_version)


_RS = _EitherVersion()
# Any character but NUL (the contract refuses it in every string: beacon.py).
_NO_NUL = st.characters(codec="utf-8", exclude_characters="\x00")

# Values that sit on, just inside and just beyond the schema's bounds, of every JSON type.
_EDGE_NUMBERS = [0, -1, -0.5, 0.0, 1, 1.0, 2.5, 999, 1000, 999.0, 4294967295, 4294967296,
                 4294967295.0, 1e10, 1e10 + 1, 10000000001, 9007199254740991,
                 9007199254740992, 1.5e300, -1e-300]  # fmt: skip
_EDGE_STRINGS = ["", "a", "GET", "get", "G" * 16, "G" * 17, "4bf92f3577b34da6a3ce929d0e0e4736",
                 "4BF92F3577B34DA6A3CE929D0E0E4736", "4bf92f3577b34da6a3ce929d0e0e4736\n",
                 "00f067aa0ba902b7", "00f067aa0ba902b7\n", "00f067aa0ba902b", "fetch",
                 "websocket", "carrier-pigeon", "sess-0001", "sess", "s p a c e", "x" * 64,
                 "x" * 65, "é" * 64, "é" * 65, "x" * 2048, "x" * 2049, "h2"]  # fmt: skip
_scalar = st.one_of(
    st.none(),
    st.booleans(),
    st.sampled_from(_EDGE_NUMBERS),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from(_EDGE_STRINGS),
    st.text(max_size=20),
)
_wild = st.one_of(
    st.sampled_from(_EDGE_NUMBERS),  # weighted: the bounds are where a hand check goes wrong
    st.sampled_from(_EDGE_STRINGS),
    _scalar,
    st.lists(_scalar, max_size=3),
    st.dictionaries(st.sampled_from(["name", "dur_ms", "desc", "x"]), _scalar, max_size=3),
)
_ms = st.one_of(st.floats(0, 1e10), st.integers(0, 10**10))


_llm = st.fixed_dictionaries(
    {
        "dialect": st.sampled_from(["openai.chat", "anthropic.messages", "ollama"]),
        "tokens": st.integers(0, 4294967295),
        "tokens_source": st.sampled_from(["usage", "events"]),
    },
    optional={
        "first_token_ms": _ms,
        "first_output_ms": _ms,
        "token_ms": st.lists(_ms, max_size=5),
        "gap_hist": st.lists(st.integers(0, 9), min_size=56, max_size=56),
        "end": st.sampled_from(["complete", "server_cut", "client_aborted", "error"]),
        "bad_events": st.integers(0, 3),
    },
)
_LLM_KEYS = [*sorted(beacon_schema.schema(2)["$defs"]["Llm"]["properties"]), "extra"]


def _valid_entry() -> st.SearchStrategy[dict[str, Any]]:
    hexs = st.text("0123456789abcdef", min_size=32, max_size=32)
    return st.fixed_dictionaries(
        {
            "trace_id": hexs,
            "span_id": hexs.map(lambda s: s[:16]),
            "kind": st.sampled_from(["fetch", "xhr", "eventsource", "websocket", "navigation"]),
            "start_ms": _ms,
        },
        optional={
            "sampled": st.booleans(),
            "seq": st.integers(0, 4294967295),
            "method": st.sampled_from(["GET", "POST", "QUERY"]),
            "url": st.text(_NO_NUL, max_size=40),
            "status": st.integers(0, 999),
            "request_start_ms": _ms,
            "response_start_ms": _ms,
            "response_end_ms": _ms,
            "dns_ms": _ms,
            "connect_ms": _ms,
            "tls_ms": _ms,
            "first_chunk_ms": _ms,
            "chunk_ms": st.lists(_ms, max_size=5),
            "chunks": st.integers(0, 4294967295),
            "rendered_ms": _ms,
            "coarse": st.booleans(),
            "chunks_coarse": st.booleans(),
            "transfer_size": st.integers(0, 9007199254740991),
            "protocol": st.sampled_from(["http/1.1", "h2", "h3"]),
            "server_timing": st.lists(
                st.fixed_dictionaries(
                    {"name": st.text(_NO_NUL, max_size=8)},
                    optional={"dur_ms": st.floats(0, 1e6), "desc": st.text(_NO_NUL, max_size=8)},
                ),
                max_size=3,
            ),
            "error": st.sampled_from(["network", "abort", "timeout"]),
            "hidden": st.booleans(),
            "llm": _llm,
        },
    )


_ENTRY_SCHEMA = beacon_schema.schema(2)["$defs"]["Entry"]
_ENTRY_KEYS = [*sorted(_ENTRY_SCHEMA["properties"]), "extra"]
_ENVELOPE_KEYS = [*sorted(beacon_schema.schema(2)["properties"]), "extra"]


@st.composite
def _mutated(draw: st.DrawFn, base: st.SearchStrategy[dict[str, Any]], keys: list[str]) -> Any:
    """A valid object with up to two keys replaced by wild values, removed or added."""
    d = dict(draw(base))
    for _ in range(draw(st.integers(0, 2))):
        k = draw(st.sampled_from(keys))
        if draw(st.booleans()) and k in d:
            del d[k]
        else:
            d[k] = draw(_wild)
    return d


def _with_llm(llm: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    return st.builds(lambda e, x: {**e, "llm": x}, _valid_entry(), llm)


_entries = st.lists(
    st.one_of(
        _valid_entry(),
        _mutated(_valid_entry(), _ENTRY_KEYS),
        _with_llm(_mutated(_llm, _LLM_KEYS)),  # a wrong value inside the nested object
        _wild,
    ),
    max_size=4,
)
_envelope = st.fixed_dictionaries(
    {
        "v": st.sampled_from([1, 2, 2.0]),  # v1 refuses llm; v2 is v1 and llm
        "site": st.sampled_from(["demo", "shop.example", "a-b_c"]),
        "session": st.sampled_from(["sess-0001", "abcdefgh" * 8]),
        "time_origin": st.one_of(st.floats(0, 2e12), st.integers(0, 2 * 10**12)),
        "entries": _entries,
    },
    optional={
        "page": st.text(_NO_NUL, max_size=10),
        "clock_drift_ms": st.floats(-1e6, 1e6),
        "sent_ms": _ms,
        "dropped": st.integers(0, 4294967295),
        "sdk": st.just("parallax-js/0.1.0"),
    },
)
_docs = st.one_of(_envelope, _mutated(_envelope, _ENVELOPE_KEYS), _wild)


_NOW_NS = 1_800_000_000 * 10**9


def _same_rows_both_paths(body: bytes) -> bool:
    """The whole-body decoder (beacons.read) either leaves the body to the entry-by-entry
    path or takes it only if it is valid and parses to exactly that path's rows and reject
    counts."""
    try:
        typed = beacons.read(body)
    except BadRequestError:
        return False
    if not isinstance(typed, Beacon):
        return False
    doc = json.loads(body)
    assert _RS.is_valid(doc), body[:500]
    a = beacons.parse(typed, _NOW_NS, _NOW_NS - 7 * 86_400 * 10**9, _NOW_NS)
    b = beacons.parse(doc, _NOW_NS, _NOW_NS - 7 * 86_400 * 10**9, _NOW_NS)
    assert (a.rows, a.trace_ids, a.rejected) == (b.rows, b.trace_ids, b.rejected), body[:500]
    for ra, rb in zip(a.rows, b.rows, strict=True):
        assert [type(x) for x in ra] == [type(x) for x in rb]
    return True


def _judge(doc: Any) -> None:
    # What the collector checks is a parsed JSON document: round-trip through JSON.
    body = json.dumps(doc).encode()
    _same_rows_both_paths(body)
    doc = json.loads(body)
    valid = _RS.is_valid(doc)
    assert (beacon.errors(doc) == []) == valid, body[:500]
    try:
        env, checked = beacon.convert(doc)
    except msgspec.ValidationError:
        # The envelope is refused (the collector answers 400): so is the beacon with every
        # entry taken out, or the envelope itself is what is wrong with the entries key.
        assert not valid, body[:500]
        if isinstance(doc, dict) and isinstance(doc.get("entries"), list):
            assert len(doc["entries"]) > 500 or not _RS.is_valid({**doc, "entries": []})
        return
    assert _RS.is_valid({**doc, "entries": []}), body[:500]
    # The envelope is good: each entry is judged alone, as the schema judges a beacon with
    # that entry only.
    for raw, c in zip(env.entries, checked, strict=True):
        alone = _RS.is_valid({**doc, "entries": [raw]})
        assert isinstance(c, Entry) == alone, (raw, c)


@settings(max_examples=600, deadline=None, suppress_health_check=list(HealthCheck))
@given(_docs)
def test_check_agrees_with_the_schema(doc: Any) -> None:
    _judge(doc)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(_valid_entry())
def test_valid_entries_pass(e: dict[str, Any]) -> None:
    v = 2 if "llm" in e else 1  # (a v1 entry has no llm)
    doc = {"v": v, "site": "demo", "session": "sess-0001", "time_origin": 1.0, "entries": [e]}
    assert beacon.errors(json.loads(json.dumps(doc))) == []
    _judge(doc)


GOOD = {
    "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736",
    "span_id": "00f067aa0ba902b7",
    "kind": "fetch",
    "start_ms": 100.0,
}


@pytest.mark.parametrize(
    "change",
    [
        {},
        {"kind": "carrier-pigeon"},
        {"status": 200.0},
        {"status": 200.5},
        {"status": True},
        {"seq": 4294967296},
        {"start_ms": 1e10},
        {"start_ms": 1e10 + 1},
        {"start_ms": -0.001},
        {"start_ms": "100"},
        {"trace_id": "4bf92f3577b34da6a3ce929d0e0e4736\n"},
        {"trace_id": "4BF92F3577B34DA6A3CE929D0E0E4736"},
        {"method": "get"},
        {"url": "x" * 2049},
        {"chunk_ms": [1.0] * 257},
        {"chunk_ms": [1.0, None]},
        {"server_timing": [{"name": "db", "dur_ms": -1}]},
        {"server_timing": [{"dur_ms": 1}]},
        {"server_timing": [{"name": "db", "other": 1}]},
        {"coarse": 1},
        {"unknown": 1},
    ],
)
def test_bad_input_cases(change: dict[str, Any]) -> None:
    _judge({"v": 1, "site": "demo", "session": "sess-0001", "time_origin": 1.0,
            "entries": [{**GOOD, **change}]})  # fmt: skip


@pytest.mark.parametrize(
    "doc",
    [
        {"v": 9, "site": "s", "entries": []},
        {"v": True, "site": "demo", "session": "sess-0001", "time_origin": 1, "entries": []},
        {"v": 1.0, "site": "demo", "session": "sess-0001", "time_origin": 1, "entries": []},
        {"v": 1, "site": "demo", "session": "short", "time_origin": 1, "entries": []},
        {"v": 1, "site": "demo", "session": "sess-0001", "time_origin": -1, "entries": []},
        {"v": 1, "site": "demo", "session": "sess-0001", "time_origin": 1, "entries": [GOOD] * 501},
        {"v": 1, "site": "demo", "session": "sess-0001", "time_origin": 1, "entries": {}},
        {"v": 1, "site": "demo", "session": "sess-0001", "time_origin": 1, "entries": [],
         "dropped": -1},
        {"v": 1, "site": "demo", "session": "sess-0001", "time_origin": 1, "entries": [],
         "sdk": "x" * 65},
        [],
        "beacon",
    ],
)  # fmt: skip
def test_bad_envelopes(doc: Any) -> None:
    _judge(doc)


def test_load_falls_back_to_json_for_what_orjson_refuses() -> None:
    """orjson refuses integers beyond 64 bits and lone surrogates, which json accepts: the
    document must come out as before (then the schema judges it), and what both refuse must
    be a 400 with json's message."""
    body = b'{"v": 1, "dropped": 100000000000000000000000, "page": "\\ud800"}'
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(body)
    assert beacons.load(body) == json.loads(body)
    with pytest.raises(BadRequestError, match="Infinity"):
        beacons.load(b'{"v": 1, "time_origin": -Infinity}')
    with pytest.raises(BadRequestError, match="malformed JSON"):
        beacons.load(b"\xff")


def test_every_key_with_every_edge_value() -> None:
    """Exhaustively: each entry and envelope key set to each edge value (bounds ± 1, wrong
    types, pattern near-misses) — the cases a random draw reaches too rarely."""
    values: list[Any] = [*_EDGE_NUMBERS, *_EDGE_STRINGS, None, True, False, [], [1.0], {}]
    values += [[{"name": "x", "dur_ms": v} for v in (0, -1, "1")], [{"name": "x"}] * 17]
    base = {"v": 1, "site": "demo", "session": "sess-0001", "time_origin": 1.0}
    for k in _ENTRY_KEYS:
        for v in values:
            _judge({**base, "entries": [{**GOOD, k: v}]})
    for k in _ENVELOPE_KEYS:
        for v in values:
            _judge({**base, "entries": [GOOD], k: v})


def test_parse_refuses_all_zero_and_newline_ids_on_both_paths() -> None:
    """On either path the ids are only compared with the all-zero ids (the Structs' patterns
    did the rest). An entry whose only fault is a trailing newline after an id is counted
    under that id's reason, as when a JSON Schema validator (whose `$` matched before it)
    judged such entries; anything else the Structs refuse is "schema"."""
    now_ns = 1_700_000_000 * 10**9
    good: dict[str, Any] = {
        "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736",
        "span_id": "00f067aa0ba902b7",
        "kind": "fetch",
        "start_ms": 1.0,
    }
    env = {"v": 1, "site": "bench", "session": "session-0001", "time_origin": now_ns / 1e6 - 60_000}
    entries = [good, {**good, "trace_id": "0" * 32}, {**good, "span_id": "0" * 16}]
    typed = beacons.read(json.dumps({**env, "entries": entries}).encode())
    assert isinstance(typed, Beacon)
    for doc in (typed, {**env, "entries": entries}):
        p = beacons.parse(doc, now_ns, 0, now_ns)
        assert len(p.rows) == 1
        assert dict(p.rejected) == {"invalid_trace_id": 1, "invalid_span_id": 1}
    newline = [
        {**good, "trace_id": good["trace_id"] + "\n"},
        {**good, "span_id": "0" * 15 + "1\n"},
        {**good, "trace_id": "0" * 32 + "\n", "span_id": "0" * 16 + "\n"},
    ]
    schema_bad = [
        {**good, "kind": "carrier-pigeon"},
        {**good, "trace_id": good["trace_id"] + "\n\n"},  # not what `$` let through
        {**good, "span_id": "0" * 15 + "1\n", "kind": "carrier-pigeon"},
        "not an entry",
    ]
    doc = {**env, "entries": [*entries, *newline, *schema_bad]}
    assert not isinstance(beacons.read(json.dumps(doc).encode()), Beacon)
    p = beacons.parse(doc, now_ns, 0, now_ns)
    assert len(p.rows) == 1
    assert dict(p.rejected) == {"invalid_trace_id": 3, "invalid_span_id": 2, "schema": 4}
    assert list(p.rejected) == ["invalid_trace_id", "invalid_span_id", "schema"]  # entry order


def test_an_invalid_envelope_is_a_400_with_where() -> None:
    """An envelope error rejects the body, naming the field; so does a trailing newline in
    the site or session (a pattern the Structs match to the end, as ECMA-262 does)."""
    env = {"v": 1, "site": "bench", "session": "session-0001", "time_origin": 1.0}
    for change, where in (
        ({"session": "short"}, "$.session"),
        ({"site": "bench\n"}, "$.site"),
        ({"time_origin": -1}, "$.time_origin"),
        ({"entries": [GOOD] * 501}, "$.entries"),
        ({"v": True}, "$.v"),
        ({"extra": 1}, "extra"),
    ):
        with pytest.raises(BadRequestError, match="^invalid beacon: .*" + re.escape(where)):
            beacons.parse({**env, "entries": [GOOD], **change}, _NOW_NS, 0, _NOW_NS)


def test_integers_written_as_floats_are_integers() -> None:
    """JSON Schema (and JavaScript) read 200.0 as the integer 200: such an entry is kept,
    with integers in its row, though not by the whole-body decoder."""
    env = {"v": 1.0, "site": "bench", "session": "session-0001", "time_origin": 1.0}
    e = {**GOOD, "status": 200.0, "seq": 3.0, "chunks": 0.0, "transfer_size": 1e3}
    body = json.dumps({**env, "dropped": 2.0, "entries": [e]}).encode()
    doc = beacons.read(body)
    assert not isinstance(doc, Beacon) and _RS.is_valid(doc)
    (row,) = beacons.parse(doc, _NOW_NS, 0, _NOW_NS).rows
    assert (row[8], row[12], row[23], row[28]) == (3, 200, 0, 1000)
    assert all(type(x) is int for x in (row[8], row[12], row[23], row[28]))


def test_every_integer_of_the_schema_is_read_as_json_schema_reads_it() -> None:
    """convert() turns integral floats into ints for the Structs' integer fields of the
    envelope and the entry: there must be no integer field anywhere else (a nested one
    would need it too)."""

    def integers(node: Any, path: str) -> set[str]:
        out = set()
        if isinstance(node, dict):
            if node.get("type") == "integer" or node.get("enum") == [1]:
                out.add(path)
            for k, v in node.items():
                out |= integers(v, f"{path}/{k}")
        elif isinstance(node, list):
            for x in node:
                out |= integers(x, path)
        return out

    schema = beacon_schema.schema(2)
    found = {p.rsplit("/", 1)[1] for p in integers(schema, "")}
    in_envelope = integers(schema["properties"], "")
    in_entry = integers(_ENTRY_SCHEMA["properties"], "")
    llm = schema["$defs"]["Llm"]["properties"]
    in_llm = integers(llm, "")
    assert {p.rsplit("/", 1)[1] for p in in_envelope} == beacon._ENVELOPE_INTS - {"v"}
    assert {p.rsplit("/", 1)[1] for p in in_entry} == beacon._ENTRY_INTS
    # The nested llm object: its integers, and its lists of integers (their items).
    assert {p.split("/")[1] for p in in_llm} == beacon._LLM_INTS | beacon._LLM_INT_LISTS
    assert {p.split("/")[1] for p in in_llm if p.count("/") > 1} == beacon._LLM_INT_LISTS
    assert found == (beacon._ENVELOPE_INTS - {"v"}) | beacon._ENTRY_INTS | {
        p.rsplit("/", 1)[1] for p in in_llm
    }
    assert 2 in schema["properties"]["v"]["enum"]  # the tag: an integer the Structs fix too
    # Each a property itself (not the items of a list property), outside the llm object.
    assert all(p.count("/") == 1 for p in in_envelope | in_entry), in_envelope | in_entry


def test_strings_the_store_cannot_hold_are_refused_on_both_paths() -> None:
    """A lone surrogate (json's fallback reads the one orjson and msgspec refuse) or a NUL in
    any string refuses its entry ("schema") or, in the envelope, the beacon (400); the
    other entries of the beacon are kept. The published schema refuses the NUL too."""
    bad_entries = [
        {**GOOD, "url": "https://x.test/\ud800"},
        {**GOOD, "error": "a\u0000b"},
        {**GOOD, "server_timing": [{"name": "db", "desc": "x\u0000"}]},
    ]
    body = json.dumps({"v": 1, "site": "s", "session": "abcdefgh", "time_origin": 1.0,
                       "entries": [*bad_entries, GOOD]}).encode()  # fmt: skip
    doc = beacons.read(body)
    assert not isinstance(doc, Beacon)
    p = beacons.parse(doc, _NOW_NS, 0, _NOW_NS)
    assert len(p.rows) == 1 and p.rejected == {"schema": 3}
    errs = beacon.errors(json.loads(body))
    assert [e.rsplit("`", 2)[1] for e in errs] == [
        "$.entries[0].url", "$.entries[1].error", "$.entries[2].server_timing[0].desc",
    ]  # fmt: skip
    nul_only = json.loads(body)
    nul_only["entries"] = nul_only["entries"][1:]  # jsonschema_rs cannot hold a surrogate
    assert not _RS.is_valid(nul_only)  # the schema's pattern: no NUL
    nul_only["entries"] = [GOOD]
    assert _RS.is_valid(nul_only)
    for env in ({"page": "/\u0000"}, {"sdk": "\ud800"}):
        body = json.dumps({"v": 1, "site": "s", "session": "abcdefgh", "time_origin": 1.0,
                           "entries": [GOOD], **env}).encode()  # fmt: skip
        with pytest.raises(BadRequestError, match=r"NUL|surrogate"):
            beacons.parse(beacons.read(body), _NOW_NS, 0, _NOW_NS)


def test_numbers_beyond_their_bounds_are_refused_not_stored_as_infinity() -> None:
    """1e400 reads as inf in json's fallback: every float now has an upper bound, so an
    infinite duration (once stored as the invalid JSON text Infinity) is refused."""
    entry = json.dumps(GOOD)
    head = '{"v": 1, "site": "s", "session": "abcdefgh", '
    for envelope in ('"time_origin": 1e400', '"time_origin": 1, "clock_drift_ms": -1e400',
                     '"time_origin": 1, "sent_ms": 1e400'):  # fmt: skip
        doc = beacons.read(f'{head}{envelope}, "entries": [{entry}]}}'.encode())
        with pytest.raises(BadRequestError, match=r"<=|>="):
            beacons.parse(doc, _NOW_NS, 0, _NOW_NS)
    timed = entry[:-1] + ', "server_timing": [{"name": "db", "dur_ms": 1e400}]}'
    doc = beacons.read(f'{head}"time_origin": 1, "entries": [{timed}, {entry}]}}'.encode())
    p = beacons.parse(doc, _NOW_NS, 0, _NOW_NS)
    assert len(p.rows) == 1 and p.rejected == {"schema": 1}


def test_deep_nesting_is_a_400_on_both_paths() -> None:
    """msgspec (the whole-body path) and json (the fallback) raise RecursionError on deep
    nesting: a 400, where it was an uncaught error (500)."""
    for depth in (1000, 100_000):
        for body in (b"[" * depth + b"]" * depth,
                     b'{"v": 1, "entries": ' + b"[" * depth + b"]" * depth + b"}"):  # fmt: skip
            with pytest.raises(BadRequestError):
                beacons.parse(beacons.read(body), _NOW_NS, 0, _NOW_NS)
    with pytest.raises(BadRequestError, match="nested too deep"):
        beacons.read(b"[" * 100_000 + b"]" * 100_000)


def test_integers_beyond_a_double_are_refused_by_both() -> None:
    """Once the one known disagreement (the Structs hold floats in doubles, and JSON Schema
    set no limit on time_origin): every number has an upper bound now. Such an envelope is
    a 400 (it was a 500: float() overflowed)."""
    huge = 10**400
    doc = {"v": 1, "site": "s", "session": "abcdefgh", "time_origin": huge, "entries": []}
    assert not _RS.is_valid(json.loads(json.dumps(doc)))
    with pytest.raises(BadRequestError, match="out of range"):
        beacons.parse(beacons.load(json.dumps(doc).encode()), _NOW_NS, 0, _NOW_NS)


def test_server_timing_is_stored_as_the_json_it_was() -> None:
    st = [{"name": "app", "dur_ms": 3.5}, {"name": "cache", "desc": "hit é"}, {"name": "x"}]
    for body in (
        json.dumps({"v": 1, "site": "s", "session": "abcdefgh", "time_origin": 1.0,
                    "entries": [{**GOOD, "server_timing": st}]}).encode(),
        json.dumps({"v": 1, "site": "s", "session": "abcdefgh", "time_origin": 1.0,
                    "entries": [{**GOOD, "server_timing": st}, {**GOOD, "kind": "x"}]}).encode(),
    ):  # fmt: skip
        (row,) = beacons.parse(beacons.read(body), _NOW_NS, 0, _NOW_NS).rows
        assert json.loads(row[30]) == st and row[30].isascii()


def _only_plain(d: dict[str, Any]) -> dict[str, Any]:
    v = int(d["v"])  # the probe writes 2, never 2.0
    return {**d, "v": v, "entries": [e for e in d["entries"] if _plain(e, v)]}


_INT_KEYS = {k for k, v in _ENTRY_SCHEMA["properties"].items() if v.get("type") == "integer"}


_LLM_INT_KEYS = {
    k
    for k, v in beacon_schema.schema(2)["$defs"]["Llm"]["properties"].items()
    if "integer" in str(v)
}


def _plain(e: Any, v: int = 1) -> bool:
    """Valid, with its integers written as integers (JSON Schema also takes 0.0 for an
    integer; the whole-body decoder leaves such a beacon to the entry-by-entry path, as the
    test below says)."""
    llm = e.get("llm") if isinstance(e, dict) else None
    return (
        isinstance(e, dict)
        and not any(isinstance(e.get(k), float) for k in _INT_KEYS)
        and not (isinstance(llm, dict) and "." in json.dumps([llm.get(k) for k in _LLM_INT_KEYS]))
        and _RS.is_valid(
            {"v": v, "site": "s", "session": "abcdefgh", "time_origin": 0, "entries": [e]}
        )
    )


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(_envelope.map(_only_plain))
def test_plain_beacons_take_the_typed_path(doc: dict[str, Any]) -> None:
    """A valid beacon as the probe writes it (numbers as JSON gives them, integers as
    integers, no nulls) is decoded whole, to the entry-by-entry path's rows."""
    assert _same_rows_both_paths(json.dumps(doc).encode()), json.dumps(doc)[:500]


def test_typed_path_refuses_what_it_cannot_prove() -> None:
    """Valid for the schema but not plain (an integer written 1.0), or invalid (a
    trailing-newline id, one bad entry among good ones, a null): decoded entry by entry."""
    good = {"trace_id": "4bf92f3577b34da6a3ce929d0e0e4736", "span_id": "00f067aa0ba902b7",
            "kind": "fetch", "start_ms": 1.0}  # fmt: skip
    env = {"v": 1, "site": "bench", "session": "session-0001", "time_origin": 1.0}
    for doc in (
        {**env, "entries": [{**good, "status": 200.0}]},
        {**env, "v": 1.0, "entries": [good]},
        {**env, "entries": [good, {**good, "kind": "carrier-pigeon"}]},
        {**env, "entries": [{**good, "span_id": "00f067aa0ba902b7\n"}]},
        {**env, "entries": [{**good, "server_timing": [{"name": "x", "dur_ms": -1}]}]},
        {**env, "entries": [{**good, "status": None}]},
    ):
        assert not isinstance(beacons.read(json.dumps(doc).encode()), Beacon), doc
    plain = {**env, "entries": [{**good, "server_timing": [{"name": "db", "dur_ms": 2}]}]}
    assert _same_rows_both_paths(json.dumps(plain).encode())


_LLM = {
    "dialect": "openai.chat",
    "first_token_ms": 151.2,
    "first_output_ms": 151.2,
    "token_ms": [151.2, 160.4],
    "tokens": 2,
    "tokens_source": "events",
    "end": "complete",
}


def test_v2_llm_is_decoded_and_v1_keeps_refusing_it() -> None:
    """v2: an entry's llm is decoded (the Struct) on both paths and stored in the entry's LLM
    columns (migration 6) — the rest of the row is v1's, and an entry without one has them
    absent; v1: an entry with llm is refused alone ("schema"), as any unknown field was, and
    its other entries are kept."""
    env = {"site": "s", "session": "abcdefgh", "time_origin": 1.7e12, "sdk": "parallax-js/0.1.0"}
    v2 = json.dumps({"v": 2, **env, "entries": [{**GOOD, "llm": _LLM}, GOOD]}).encode()
    typed = beacons.read(v2)
    assert isinstance(typed, Beacon) and beacon.version_of(typed) == 2
    llm = typed.entries[0].llm
    assert llm is not None
    assert (llm.tokens, llm.end, llm.token_ms) == (2, "complete", [151.2, 160.4])
    assert typed.entries[1].llm is None
    rows_v2 = beacons.parse(typed, _NOW_NS, 0, _NOW_NS).rows
    v1 = json.dumps({"v": 1, **env, "entries": [GOOD, GOOD]}).encode()
    rows_v1 = beacons.parse(beacons.read(v1), _NOW_NS, 0, _NOW_NS).rows
    v1_cols = len(schema.ENTRY_COLUMNS) - len(schema.ENTRY_LLM_COLUMNS)
    assert [r[:v1_cols] for r in rows_v2] == [r[:v1_cols] for r in rows_v1]
    assert len(rows_v1) == 2 and rows_v2[1] == rows_v1[1]  # no llm: absent, never 0
    names = schema.column_names(schema.ENTRY_LLM_COLUMNS)
    llm_cols = dict(zip(names, rows_v2[0][v1_cols:], strict=True))
    assert llm_cols == {
        "llm_dialect": _LLM["dialect"],
        "llm_first_token_ms": _LLM["first_token_ms"],
        "llm_first_output_ms": _LLM["first_output_ms"],
        "llm_token_ms": _LLM["token_ms"],
        "llm_gap_hist": [],
        "llm_tokens": 2,
        "llm_tokens_source": _LLM["tokens_source"],
        "llm_end": "complete",
        "llm_bad_events": None,
    }
    assert rows_v1[0][v1_cols:] == ("", None, None, [], [], None, "", "", None)
    bad = json.dumps({"v": 1, **env, "entries": [{**GOOD, "llm": _LLM}, GOOD]}).encode()
    doc = beacons.read(bad)
    assert not isinstance(doc, Beacon)  # the whole-body path leaves it to the entries path
    p = beacons.parse(doc, _NOW_NS, 0, _NOW_NS)
    assert len(p.rows) == 1 and p.rejected == {"schema": 1}
    assert beacon.errors(json.loads(bad)) == [
        "Object contains unknown field `llm` (beacon v1) - at `$.entries[0]`"
    ]
    with pytest.raises(BadRequestError, match="unknown beacon version 3"):
        beacons.read(json.dumps({"v": 3, **env, "entries": []}).encode())
