"""The hand-written beacon check (collector.ingest.beacon_check) accepts and rejects exactly
what the contract's JSON Schema does: hypothesis-generated beacons, valid ones and ones with
values at and beyond every bound, wrong types, extra and missing keys, are judged by both
the compiled schema validator (jsonschema_rs, the previous hot path) and the contract's
Python validator (parallax_contracts.beacon), and the answers must agree."""

from __future__ import annotations

import json
from typing import Any

import jsonschema_rs
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from collector.ingest import beacon_check, beacons
from collector.ingest.common import BadRequestError
from parallax_contracts import beacon

_RS = jsonschema_rs.validator_for(beacon.schema())

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
            "url": st.text(max_size=40),
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
                    {"name": st.text(max_size=8)},
                    optional={"dur_ms": st.floats(0, 1e6), "desc": st.text(max_size=8)},
                ),
                max_size=3,
            ),
            "error": st.sampled_from(["network", "abort", "timeout"]),
            "hidden": st.booleans(),
        },
    )


_ENTRY_KEYS = [*sorted(beacon.schema()["$defs"]["entry"]["properties"]), "extra"]
_ENVELOPE_KEYS = [*sorted(beacon.schema()["properties"]), "extra"]


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


_entries = st.lists(
    st.one_of(_valid_entry(), _mutated(_valid_entry(), _ENTRY_KEYS), _wild), max_size=4
)
_envelope = st.fixed_dictionaries(
    {
        "v": st.just(1),
        "site": st.sampled_from(["demo", "shop.example", "a-b_c"]),
        "session": st.sampled_from(["sess-0001", "abcdefgh" * 8]),
        "time_origin": st.one_of(st.floats(0, 2e12), st.integers(0, 2 * 10**12)),
        "entries": _entries,
    },
    optional={
        "page": st.text(max_size=10),
        "clock_drift_ms": st.floats(-1e6, 1e6),
        "sent_ms": _ms,
        "dropped": st.integers(0, 4294967295),
        "sdk": st.just("parallax-js/0.1.0"),
    },
)
_docs = st.one_of(_envelope, _mutated(_envelope, _ENVELOPE_KEYS), _wild)


_NOW_NS = 1_800_000_000 * 10**9


def _same_rows_both_paths(body: bytes) -> bool:
    """The typed decoder (beacons.read) either gives the body up to the dict path or takes it
    only if it is valid and parses to exactly the dict path's rows and reject counts."""
    try:
        typed = beacons.read(body)
    except BadRequestError:
        return False
    if not isinstance(typed, beacons.Beacon):
        return False
    doc = json.loads(body)
    assert beacon_check.is_valid(doc), body[:500]
    a = beacons.parse(typed, _NOW_NS, _NOW_NS - 7 * 86_400 * 10**9, _NOW_NS)
    b = beacons.parse(doc, _NOW_NS, _NOW_NS - 7 * 86_400 * 10**9, _NOW_NS)
    assert (a.rows, a.trace_ids, a.rejected) == (b.rows, b.trace_ids, b.rejected), body[:500]
    for ra, rb in zip(a.rows, b.rows, strict=True):
        assert [type(x) for x in ra] == [type(x) for x in rb]
    return True


def _judge(doc: Any) -> None:
    # What the collector checks is a parsed JSON document: round-trip through JSON.
    _same_rows_both_paths(json.dumps(doc).encode())
    doc = json.loads(json.dumps(doc))
    mine = beacon_check.is_valid(doc)
    assert mine == _RS.is_valid(doc), json.dumps(doc)[:500]
    # Python's re lets "$" match before a trailing newline; ECMA-262 and the compiled
    # validator do not (the check follows them). Elsewhere the two validators agree.
    if "\\n" not in json.dumps(doc):
        assert mine == (not beacon.errors(doc)), json.dumps(doc)[:500]


@settings(max_examples=600, deadline=None, suppress_health_check=list(HealthCheck))
@given(_docs)
def test_check_agrees_with_the_schema(doc: Any) -> None:
    _judge(doc)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(_valid_entry())
def test_valid_entries_pass(e: dict[str, Any]) -> None:
    doc = {"v": 1, "site": "demo", "session": "sess-0001", "time_origin": 1.0, "entries": [e]}
    assert beacon_check.is_valid(json.loads(json.dumps(doc)))
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
    """When the hand-written check passes the beacon, the ids are only compared with the
    all-zero ids (its fullmatch did the rest); when it does not (another entry is bad), the
    schema's patterns let an id with a trailing newline through, and parse refuses it."""
    now_ns = 1_700_000_000 * 10**9
    good: dict[str, Any] = {
        "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736",
        "span_id": "00f067aa0ba902b7",
        "kind": "fetch",
        "start_ms": 1.0,
    }
    env = {"v": 1, "site": "bench", "session": "session-0001", "time_origin": now_ns / 1e6 - 60_000}
    entries = [good, {**good, "trace_id": "0" * 32}, {**good, "span_id": "0" * 16}]
    assert beacon_check.is_valid({**env, "entries": entries})
    p = beacons.parse({**env, "entries": entries}, now_ns, 0, now_ns)
    assert len(p.rows) == 1
    assert dict(p.rejected) == {"invalid_trace_id": 1, "invalid_span_id": 1}
    newline = [{**good, "trace_id": good["trace_id"] + "\n"}, {**good, "span_id": "0" * 15 + "1\n"}]
    doc = {**env, "entries": [*entries, *newline, {**good, "kind": "carrier-pigeon"}]}
    assert not beacon_check.is_valid(doc)
    p = beacons.parse(doc, now_ns, 0, now_ns)
    assert len(p.rows) == 1
    assert dict(p.rejected) == {"invalid_trace_id": 2, "invalid_span_id": 2, "schema": 1}


def _only_plain(d: dict[str, Any]) -> dict[str, Any]:
    return {**d, "entries": [e for e in d["entries"] if _plain(e)]}


_INT_KEYS = {
    k
    for k, v in beacon.schema()["$defs"]["entry"]["properties"].items()
    if v.get("type") == "integer"
}


def _plain(e: Any) -> bool:
    """Valid, with its integers written as integers (JSON Schema also takes 0.0 for an
    integer; the typed path leaves such a beacon to the dict path, as the test below says)."""
    return (
        isinstance(e, dict)
        and not any(isinstance(e.get(k), float) for k in _INT_KEYS)
        and _RS.is_valid(
            {"v": 1, "site": "s", "session": "abcdefgh", "time_origin": 0, "entries": [e]}
        )
    )


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(_envelope.map(_only_plain))
def test_plain_beacons_take_the_typed_path(doc: dict[str, Any]) -> None:
    """A valid beacon as the probe writes it (numbers as JSON gives them, integers as
    integers, no nulls) is decoded by the typed path, to the dict path's rows."""
    assert _same_rows_both_paths(json.dumps(doc).encode()), json.dumps(doc)[:500]


def test_typed_path_refuses_what_it_cannot_prove() -> None:
    """Valid for the schema but not plain (an integer written 1.0, a trailing-newline id
    the dict path judges, one bad entry among good ones): the dict path decides."""
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
        assert not isinstance(beacons.read(json.dumps(doc).encode()), beacons.Beacon), doc
    plain = {**env, "entries": [{**good, "server_timing": [{"name": "db", "dur_ms": 2}]}]}
    assert _same_rows_both_paths(json.dumps(plain).encode())
