"""W3C traceparent: the shared vectors, and properties over generated input."""

from __future__ import annotations

import json
import string

from hypothesis import given
from hypothesis import strategies as st

from parallax_contracts import CONTRACTS_DIR
from parallax_contracts.trace_context import (
    FLAG_SAMPLED,
    TraceContext,
    generate,
    is_valid_span_id,
    is_valid_trace_id,
    parse,
)

VECTORS = json.loads((CONTRACTS_DIR / "traceparent-vectors.json").read_text())["vectors"]
hex_lower = st.text(alphabet="0123456789abcdef", min_size=1, max_size=1)


def test_shared_vectors() -> None:
    assert len(VECTORS) > 20
    for v in VECTORS:
        got = parse(v["input"])
        if not v["valid"]:
            assert got is None, v["note"]
            continue
        assert got is not None, v["note"]
        assert (got.trace_id, got.span_id, got.flags) == (v["trace_id"], v["span_id"], v["flags"])
        assert got.sampled is v["sampled"]


def test_bytes_input_and_non_ascii() -> None:
    v = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    assert parse(v.encode()) == parse(v)
    assert parse("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0\u00e9".encode()) is None
    assert parse(b"\xff" * 55) is None
    assert parse(None) is None


@given(
    st.text(alphabet="0123456789abcdef", min_size=32, max_size=32),
    st.text(alphabet="0123456789abcdef", min_size=16, max_size=16),
    st.integers(0, 255),
)
def test_round_trip(trace_id: str, span_id: str, flags: int) -> None:
    tc = parse(TraceContext(trace_id, span_id, flags).header())
    valid = is_valid_trace_id(trace_id) and is_valid_span_id(span_id)
    assert (tc is not None) == valid
    if tc is not None:
        assert (tc.trace_id, tc.span_id, tc.flags) == (trace_id, span_id, flags)
        assert tc.header() == f"00-{trace_id}-{span_id}-{flags:02x}"


@given(st.text(alphabet=string.printable, max_size=80))
def test_never_raises_and_only_accepts_well_formed(s: str) -> None:
    tc = parse(s)
    if tc is not None:
        assert is_valid_trace_id(tc.trace_id) and is_valid_span_id(tc.span_id)
        assert 0 <= tc.flags <= 255


@given(st.booleans())
def test_generate(sampled: bool) -> None:
    tc = generate(sampled)
    assert parse(tc.header()) == tc
    assert bool(tc.flags & FLAG_SAMPLED) is sampled
