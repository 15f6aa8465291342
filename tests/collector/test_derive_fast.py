"""The compiled one-hop pair derivation (collector/pairing/_derive_fast.c) against the
reference, ``rules.derive(entry, [span], [], 0, sample_th, version)``: on hypothesis-drawn
entries and spans (absent and present parts, NaN, ±inf, −0.0, huge and negative values,
chunk lists of every length, hold and retransmit attributes with good and bad text, LLM
streams on either side), on the bench's rows as the parsers write them, and on the store's
read-back form (a real collector on chDB: tests/collector/test_llm_collector.py pairs
through it too).

Wherever the compiled one answers, its row equals the reference's field for field, types
included (NaN equal to NaN); where the reference raises, it raises the same exception type;
it answers None only for what it does not model (a row of another length, a list field that
is not a list or tuple), and never on the parsers' rows."""

from __future__ import annotations

import contextlib
import math
import time
import tracemalloc
from collections.abc import Callable
from typing import Any, NamedTuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench.collector import _bodies
from collector.ingest import beacons, otlp
from collector.pairing import llm, rules
from collector.pairing.pairer import as_entry, as_span
from collector.store.rows import EntryRow, PairRow, SpanRow
from parallax_contracts import compiled, genai
from parallax_contracts import span_attributes as sa

NOW = time.time_ns()
Derive = Callable[[EntryRow, SpanRow, int, int], PairRow | None]


@pytest.fixture(scope="module")
def derive_one() -> Derive:
    """The compiled derivation, built here if setup has not (skipped only without a C
    toolchain: a build that fails where one exists is a failure), configured as the pairer
    configures it."""
    missing = compiled.toolchain_missing()
    if missing is not None:
        pytest.skip(missing)
    ok, msg = compiled.build(compiled.DERIVE_SOURCE)
    assert ok, msg
    fast, said = rules._load_compiled()
    assert fast is not None, said
    f: Derive = fast.derive_one
    return f


@pytest.fixture(scope="module")
def real_rows() -> list[tuple[EntryRow, SpanRow]]:
    """One-hop (entry, span) pairs as the parsers write them (the collector bench's bodies)."""
    spans_b, beacons_b = _bodies(200, 5)
    spans = [as_span(r) for b in spans_b for r in otlp.parse(b, False, NOW, 0, NOW).rows]
    entries = [
        as_entry(r) for b in beacons_b for r in beacons.parse(beacons.load(b), NOW, 0, NOW).rows
    ]
    by_trace = {e.trace_id: e for e in entries}
    return [(by_trace[s.trace_id], s) for s in spans]


def _same(a: Any, b: Any) -> bool:
    """Equal and of one type, NaN equal to NaN, lists item by item."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        same_sign = math.copysign(1, a) == math.copysign(1, b)
        return (math.isnan(a) and math.isnan(b)) or (a == b and same_sign)
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def _odd(row: Any, **values: Any) -> Any:
    """The row with values of types the schema does not give (read back, or bad input)."""
    return row._replace(**values)


def _reference(e: EntryRow, s: SpanRow, th: int, version: int) -> PairRow | type[Exception]:
    try:
        return rules.derive(e, [s], [], 0, th, version)
    except Exception as exc:  # noqa: BLE001 — the type is what is compared
        return type(exc)


def _check(derive_one: Derive, e: EntryRow, s: SpanRow, th: int = 0, version: int = NOW) -> None:
    want = _reference(e, s, th, version)
    try:
        got: Any = derive_one(e, s, th, version)
    except Exception as exc:  # noqa: BLE001
        got = type(exc)
    assert got is not None, "the compiled derivation gave up on a modelled row"
    if isinstance(want, type):
        assert got is want, (got, want)
        return
    assert type(got) is PairRow, got
    bad = [f for f, x, y in zip(PairRow._fields, got, want, strict=True) if not _same(x, y)]
    assert not bad, {f: (getattr(got, f), getattr(want, f)) for f in bad}


# --- drawn rows ---------------------------------------------------------------------------

ODD_FLOATS = st.sampled_from([math.nan, math.inf, -math.inf, -0.0, 0.0, 1e308, -1e-300])
MS = st.one_of(st.none(), st.floats(-1e6, 1e7), ODD_FLOATS)
US = st.one_of(st.none(), st.integers(-(10**6), 10**9), st.just(0), st.integers(2**62, 2**63))
NS = st.one_of(st.integers(1_600_000_000 * 10**9, 1_900_000_000 * 10**9), st.integers(0, 10**6))
TEXT_US = st.one_of(
    st.integers(-5, 10**7).map(str),
    st.sampled_from(["", " 12 ", "1_000", "x", "1.5", "٣", "-0"]),
)


@st.composite
def attributes(draw: st.DrawFn) -> dict[str, str]:
    attrs: dict[str, str] = {}
    names = [
        sa.WIRE_HOLD_MAX_US.name, sa.WIRE_HOLD_REASON.name, sa.RETRANSMIT_WAIT_US.name,
        genai.DIALECT.name, genai.GEN_AI_USAGE_OUTPUT_TOKENS.name, genai.END.name, "other",
    ]  # fmt: skip
    for name in draw(st.lists(st.sampled_from(names), unique=True, max_size=5)):
        if name == genai.DIALECT.name:
            attrs[name] = draw(st.sampled_from(["openai", "anthropic", ""]))
        elif name in (sa.WIRE_HOLD_REASON.name, genai.END.name):
            attrs[name] = draw(st.sampled_from(["", "nagle", "stop", "cork"]))
        else:
            attrs[name] = draw(TEXT_US)
    return attrs


@st.composite
def one_hop(draw: st.DrawFn, entry: EntryRow, span: SpanRow) -> tuple[EntryRow, SpanRow]:
    chunk_ms = draw(st.lists(st.one_of(st.floats(-1e3, 1e6), ODD_FLOATS), max_size=6))
    e = entry._replace(
        request_start_ms=draw(MS), response_start_ms=draw(MS), response_end_ms=draw(MS),
        first_chunk_ms=draw(MS), rendered_ms=draw(MS), chunk_ms=chunk_ms,
        time_origin_ms=draw(st.one_of(st.floats(0, 2e12), st.integers(0, 2 * 10**12))),
        clock_drift_ms=draw(MS), seq=draw(st.sampled_from([0, 1, 7])),
        coarse=draw(st.booleans()), chunks_coarse=draw(st.booleans()),
        route=draw(st.sampled_from(["", "/v1/chat"])), method=draw(st.sampled_from(["", "GET"])),
        status=draw(st.sampled_from([None, 0, 200, 503])),
        llm_dialect=draw(st.sampled_from(["", "", "openai"])),
        llm_first_token_ms=draw(MS),
        llm_token_ms=draw(st.lists(st.floats(0, 1e5), max_size=4)),
    )  # fmt: skip
    arrival = draw(st.one_of(st.none(), st.just(0), NS))
    s = span._replace(
        time=draw(NS), ttfb_us=draw(US), duration_us=draw(st.integers(-10, 10**9)),
        ttft_us=draw(US), chunk_offsets_us=draw(st.lists(st.integers(-10**6, 10**12), max_size=6)),
        arrival=arrival, recv_queue_us=draw(US), retransmits=draw(st.sampled_from([None, 0, 3])),
        srtt_us=draw(US), attributes=draw(attributes()),
        route=draw(st.sampled_from(["", "/v1/chat"])), method=draw(st.sampled_from(["", "POST"])),
        status=draw(st.sampled_from([0, 200, 429])), service=draw(st.sampled_from(["", "api"])),
    )  # fmt: skip
    return e, s


def test_drawn_rows_equal_the_reference(
    derive_one: Derive, real_rows: list[tuple[EntryRow, SpanRow]]
) -> None:
    entry, span = real_rows[0]

    @settings(max_examples=600, deadline=None, suppress_health_check=list(HealthCheck))
    @given(rows=one_hop(entry, span), th=st.integers(0, 2**56), version=st.integers(0, 2**63))
    def check(rows: tuple[EntryRow, SpanRow], th: int, version: int) -> None:
        _check(derive_one, *rows, th, version)

    check()


def test_the_parsers_rows_and_the_store_form_equal_the_reference(
    derive_one: Derive, real_rows: list[tuple[EntryRow, SpanRow]]
) -> None:
    """The parsers' rows (all modelled, none given up on), and the same rows as the store
    reads them back (tuples for lists, a stream dialect on both sides)."""
    assert len(real_rows) == 200
    for e, s in real_rows:
        _check(derive_one, e, s, 5, NOW)
    e, s = real_rows[0]
    llm_e = e._replace(llm_dialect="openai", llm_first_token_ms=120.5, llm_token_ms=[120.5, 130.0])
    llm_s = s._replace(attributes={genai.DIALECT.name: "openai", genai.END.name: "stop"})
    read_back = _odd(e, chunk_ms=tuple(e.chunk_ms))
    for pair in ((llm_e, llm_s), (e, llm_s), (llm_e, s), (read_back, s)):
        _check(derive_one, *pair)
    assert derive_one(llm_e, llm_s, 0, NOW).llm_dialect == "openai"  # type: ignore[union-attr]


def test_what_it_does_not_model_goes_to_the_reference(
    derive_one: Derive, real_rows: list[tuple[EntryRow, SpanRow]]
) -> None:
    """None for rows it does not model; rules.pair then derives them in Python; a bad value
    raises what the reference raises."""
    e, s = real_rows[0]
    odd = _odd(e, chunk_ms=iter([1.0, 2.0]))
    assert derive_one(odd, s, 0, NOW) is None
    assert derive_one(tuple(e)[:-1], s, 0, NOW) is None  # type: ignore[arg-type]
    assert derive_one(e, _odd(s, chunk_offsets_us={1, 2}), 0, NOW) is None
    s2 = s._replace(parent_span_id=e.span_id, ws_seq=e.seq)
    paired = rules.pair(odd._replace(chunk_ms=[1.0, 2.0]), [s2], NOW)
    assert paired is not None and paired.user_itl_ms == [1.0]
    with pytest.raises(TypeError):
        derive_one(_odd(e, request_start_ms="1"), s, 0, NOW)
    _check(derive_one, _odd(e, request_start_ms="1"), s)
    _check(derive_one, e, _odd(s, attributes={sa.WIRE_HOLD_MAX_US.name: ["1"]}))


def test_a_pair_field_it_does_not_know_turns_it_off() -> None:
    """A column added to PairRow without the C: configure refuses, the pairer says so and
    derives in Python."""
    missing = compiled.toolchain_missing()
    if missing is not None:
        pytest.skip(missing)
    from collector.pairing import _derive_fast

    configure: Any = _derive_fast.configure  # given a type other than PairRow's on purpose
    wider = NamedTuple("Wider", [(f, Any) for f in (*PairRow._fields, "new_column")])  # type: ignore[misc]
    absent = dict(zip(llm.PAIR_LLM_NAMES, llm.NO_LLM, strict=True))
    args = (EntryRow._fields, SpanRow._fields, absent, tuple(llm.PAIR_LLM_NAMES), llm.pair_columns)
    names = (sa.WIRE_HOLD_MAX_US.name, sa.WIRE_HOLD_REASON.name, sa.RETRANSMIT_WAIT_US.name, "d")
    try:
        with pytest.raises(ValueError, match="neither computed nor an LLM column"):
            configure(wider, *args, names)
        with pytest.raises(ValueError, match="EntryRow has no field"):
            configure(PairRow, ("time",), *args[1:], names)
    finally:
        fast, said = rules._load_compiled()  # configured again as the pairer has it
    assert fast is not None, said


def test_no_reference_is_leaked(
    derive_one: Derive, real_rows: list[tuple[EntryRow, SpanRow]]
) -> None:
    """20,000 rounds of derivations of every kind (a hold, an LLM stream, an error) keep
    no memory."""
    e, s = real_rows[0]
    hold = {sa.WIRE_HOLD_MAX_US.name: "1500", sa.WIRE_HOLD_REASON.name: "cork"}
    held = s._replace(attributes=hold)
    llm_s = s._replace(attributes={genai.DIALECT.name: "openai"})
    bad = _odd(e, response_end_ms="x")
    cases = [(e, s), (e, held), (e, llm_s)]

    def run(n: int) -> None:
        for _ in range(n):
            for a, b in cases:
                derive_one(a, b, 0, NOW)
            with contextlib.suppress(TypeError):
                derive_one(bad, s, 0, NOW)

    run(1000)  # warm: freelists, caches
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        run(20_000)
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 64 * 1024, f"{grown} bytes kept after 80,000 derivations"
