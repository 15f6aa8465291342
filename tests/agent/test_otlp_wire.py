"""The agent's OTLP spans, written by hand (agent.export.otlp_wire), against what the
OpenTelemetry SDK's encoder makes of the same span: a ``ReadableSpan`` built as the agent
built it before (the reference here), encoded by ``encode_spans``. Both requests are parsed
with the generated protobuf classes and compared whole — ids, trace state, flags, status,
every attribute in order and its value's type. The SDK is only the oracle: nothing of it
runs in the agent's encoding. Each test runs with the attribute loop in Python (the
reference) and compiled (agent/export/_otlp_wire_fast.c; skipped without a C toolchain, a
failed build fails)."""

from __future__ import annotations

import enum
import random
from collections.abc import Callable, Mapping
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.common._internal import _encode_attributes
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, TraceFlags, TraceState
from opentelemetry.trace.status import Status, StatusCode

from agent import records
from agent.export import otlp_wire
from agent.export.spans import _SCOPE, span_of
from agent.kernel.clock import MonoClock
from agent.kernel.events import Hold
from agent.protocols.exchange import Exchange
from parallax_contracts import compiled, trace_context
from parallax_contracts import span_attributes as sa
from parallax_contracts.routes import route_template
from tests.agent.helpers import build_compiled, fresh_value

Loop = Callable[[bytes, Mapping[str, Any]], bytes]
Loops = tuple[Loop, "otlp_wire.RecordAttributes | None"]


@pytest.fixture(scope="module")
def compiled_loops() -> Loops:
    build_compiled(compiled.OTLP_WIRE_SOURCE, "agent.export._otlp_wire_fast")
    fn, fields, said = otlp_wire._load_compiled()
    assert "compiled" in said and "Python" not in said and fields is not None, said
    return fn, fields


@pytest.fixture(scope="module", params=["python", "compiled"])
def loops(request: pytest.FixtureRequest) -> Loops:
    """The attribute loops: the Python reference's, or the compiled ones."""
    if request.param == "python":
        return otlp_wire._attributes_py, None
    compiled_ones: Loops = request.getfixturevalue("compiled_loops")
    return compiled_ones


@pytest.fixture(scope="module")
def loop(loops: Loops) -> Loop:
    return loops[0]


@pytest.fixture
def encoder(loops: Loops, monkeypatch: pytest.MonkeyPatch) -> Loops:
    """The span encoder with these loops (compiled: the record's fields read in C)."""
    monkeypatch.setattr(otlp_wire, "attributes", loops[0])
    monkeypatch.setattr(otlp_wire, "record_attributes", loops[1])
    return loops


def _sdk_span(rec: dict[str, Any], resource: Resource) -> ReadableSpan:
    """The record as the agent made it a span through the SDK (until otlp_wire)."""
    flags = TraceFlags(rec["trace_flags"] | TraceFlags.SAMPLED)
    state = TraceState([("ot", f"th:{rec.get('sample_th') or '0'}")])
    ctx = SpanContext(int(rec["trace_id"], 16), int(rec["span_id"], 16), False, flags, state)
    parent = (
        SpanContext(int(rec["trace_id"], 16), int(rec["parent_span_id"], 16), True, flags)
        if rec["parent_span_id"]
        else None
    )
    attrs = records.span_attributes(rec)
    route = route_template(rec["path"])
    attrs[sa.HTTP_ROUTE.name] = route
    status = rec.get("status") or 0
    return ReadableSpan(
        name=f"{rec['method']} {route}",
        context=ctx,
        parent=parent,
        resource=resource,
        attributes=attrs,
        kind=SpanKind.SERVER,
        start_time=rec["start_unix_ns"],
        end_time=rec["end_unix_ns"],
        status=Status(StatusCode.ERROR) if status >= 500 else Status(StatusCode.UNSET),
        instrumentation_scope=InstrumentationScope("parallax.agent"),
    )


def _records(n: int, seed: int) -> list[dict[str, Any]]:
    """Records of varied exchanges, through the agent's own records.build."""
    rnd = random.Random(seed)
    clock = MonoClock()
    tp = trace_context.parse("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
    out = []
    for i in range(n):
        t1 = 10**12 + rnd.randrange(10**9)
        ex = Exchange(
            rnd.choice(["GET", "POST", "PATCH"]),
            rnd.choice(["/", "/v1/chat/completions", f"/users/{i}/x", "/é/ü?q=1", "/" + "a" * 300]),
            rnd.choice(["1.1", "2"]),
            rnd.choice([tp, None]),
            rnd.random() < 0.2,
            t1=t1,
            t_arr=t1 - rnd.choice([0, 5000]),
            t2=t1 + rnd.choice([0, 30_000, 10**10]),
            t_tok=t1 + rnd.choice([0, 40_000]),
            t_end=t1 + rnd.choice([0, 50_000, 10**11]),
            status=rnd.choice([0, 200, 404, 500, 503]),
            chunks=rnd.choice([0, 1, 3, 900]),
            chunk_offs_us=[rnd.randrange(10 ** rnd.randrange(1, 9)) for _ in range(40)],
            gap_max_ns=rnd.randrange(10**8),
            bytes_in=rnd.randrange(10**6),
            bytes_out=rnd.randrange(10**9),
            srtt_us=rnd.choice([0, 40, 200_000]),
            retransmits=rnd.choice([0, 3]),
            retransmit_wait_us=rnd.choice([None, 0, 1200]),
            partial=rnd.random() < 0.2,
            client_aborted=rnd.random() < 0.2,
            sample_th=rnd.choice([0, 1 << 20]),
            rpc_system=rnd.choice([None, "grpc"]),
            grpc_status=rnd.choice([None, 0, 14]),
            ws_seq=rnd.choice([0, 7]),
        )
        if rnd.random() < 0.3:
            ex.hold = Hold(3, 45_000, 60_000, 1, "nagle", ("nagle",), 1400)
        conn = records.ConnInfo(
            rnd.randrange(1, 1 << 22), "python3", rnd.choice(["chat", "engine"]),
            "10.0.0.1", 8000, rnd.choice(["10.0.0.2", "2001:db8::1"]), rnd.randrange(65536),
            rnd.random() < 0.5,
        )  # fmt: skip
        rec = records.build(ex, conn, clock)
        if rnd.random() < 0.3:  # an LLM stream's fields, of every type they take
            rec.update(
                gen_ai_operation_name="chat",
                gen_ai_response_model="llama-3.1-8b",
                gen_ai_response_finish_reasons=rnd.choice([["stop"], ["length", "stop"], []]),
                gen_ai_usage_output_tokens=rnd.randrange(5000),
                gen_ai_request_stream=True,
                gen_ai_response_time_to_first_chunk=rnd.choice([0.0, 0.0421, 3.5]),
                llm_token_offsets_us=[rnd.randrange(10**7) for _ in range(rnd.randrange(1100))],
                llm_stall_tokens=rnd.choice([None, [4, 90]]),
                llm_gaps_exact=rnd.choice([None, False, True]),
                llm_end="complete",
            )
        out.append(rec)
    return out


def _resource(rec: dict[str, Any], extra: dict[str, Any]) -> Resource:
    return Resource.create(
        {
            sa.RESOURCE_HOST_NAME: "node-1",
            **extra,
            sa.RESOURCE_SERVICE_NAME: rec["service"],
            sa.RESOURCE_PROCESS_PID: rec["pid"],
            sa.RESOURCE_PROCESS_EXECUTABLE_NAME: rec["comm"],
        }
    )


@pytest.mark.parametrize("seed", range(4))
def test_a_batch_equals_the_sdks_request(seed: int, encoder: Loops) -> None:
    recs = _records(300, seed)
    extra = {"k8s.pod.name": "chat-7d9f", "k8s.namespace.name": "prod"} if seed % 2 else {}
    resources: dict[tuple[int, str], Resource] = {}
    for r in recs:  # one Resource per process, as the exporter caches them
        resources.setdefault((r["pid"], r["service"]), _resource(r, extra))
    sdk = ExportTraceServiceRequest.FromString(
        encode_spans(
            [_sdk_span(r, resources[r["pid"], r["service"]]) for r in recs]
        ).SerializeToString()
    )
    encoded = {k: otlp_wire.resource(v.attributes) for k, v in resources.items()}
    ours_bytes = otlp_wire.request(
        [(encoded[r["pid"], r["service"]], span_of(r)) for r in recs], _SCOPE
    )
    ours = ExportTraceServiceRequest.FromString(ours_bytes)
    assert len(ours.resource_spans) == len(resources) > 1
    for mine, theirs in zip(ours.resource_spans, sdk.resource_spans, strict=True):
        assert mine.resource == theirs.resource
        assert mine.scope_spans[0].scope == theirs.scope_spans[0].scope
        for a, b in zip(mine.scope_spans[0].spans, theirs.scope_spans[0].spans, strict=True):
            assert a == b, (a, b)
    assert ours == sdk
    # and byte for byte: the same fields in the same order
    assert ours_bytes == sdk.SerializeToString()


def test_each_span_flags_status_and_ids(encoder: Loops) -> None:
    """The fields the collector reads first, spelled out (a wrong constant in both the
    encoder and the oracle would pass the comparison above)."""
    rec = _records(1, 9)[0]
    rec.update(
        parent_span_id="b7ad6b7169203331", status=503, sample_th="fffff", method="GET", path="/"
    )
    s = Span.FromString(span_of(rec))
    assert s.trace_id.hex() == rec["trace_id"] and s.span_id.hex() == rec["span_id"]
    assert s.parent_span_id.hex() == "b7ad6b7169203331"
    assert s.trace_state == "ot=th:fffff"
    assert s.kind == Span.SpanKind.SPAN_KIND_SERVER and s.name == "GET /"
    assert s.status.code == 2 and s.flags == 0x300
    assert (s.start_time_unix_nano, s.end_time_unix_nano) == (
        rec["start_unix_ns"],
        rec["end_unix_ns"],
    )
    rec.update(parent_span_id=None, status=200)
    s = Span.FromString(span_of(rec))
    assert not s.parent_span_id and s.status.code == 0 and s.HasField("status")
    assert s.flags == 0x100


_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=300)
    | st.binary(max_size=200),
    lambda inner: st.lists(inner, max_size=40) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=60,
)


@given(st.dictionaries(st.text(max_size=140), _VALUES, max_size=30))
def test_drawn_attributes_encode_as_the_sdks(loop: Loop, attrs: dict[str, Any]) -> None:
    """Every value type an attribute can take (nested arrays and maps, negative and 64-bit
    ints, non-ASCII and long strings whose lengths take two varint bytes)."""
    ours = loop(b"\x0a", attrs)
    theirs = b"".join(
        b"\x0a" + otlp_wire.varint(len(kv)) + kv
        for kv in (k.SerializeToString() for k in _encode_attributes(attrs))
    )
    assert ours == theirs
    assert [KeyValue.FromString(kv).key for kv in _split(ours)] == list(attrs)


class _Code(enum.IntEnum):
    OK = 0


class _Name(str):
    pass


def test_the_compiled_loop_hands_rare_values_to_the_reference(compiled_loops: Loops) -> None:
    """Subclasses, bytes, maps, None and ints beyond int64 (which the SDK cannot encode:
    records never carry them) go through the Python reference's any_value, inside lists
    too; the two loops agree on them, and on a long list that needs a 2-byte length."""
    attrs: dict[str, Any] = {
        "enum": _Code.OK,
        "sub": _Name("x"),
        "raw": b"\x00\xff",
        "map": {"k": None, "n": [1, "a"]},
        "none": None,
        "big": 2**64 + 5,
        "small": -(2**63) - 1,
        "mixed": [b"x", {"k": 1.5}, _Code.OK, None, 2**70],
        "long": list(range(-50, 2000)),
        "": "an empty name",
    }
    assert compiled_loops[0](b"\x4a", attrs) == otlp_wire._attributes_py(b"\x4a", attrs)


def _split(buf: bytes) -> list[bytes]:
    """The payloads of a run of length-delimited fields."""
    out, i = [], 0
    while i < len(buf):
        i += 1  # the tag (one byte here)
        n = shift = 0
        while True:
            b = buf[i]
            i += 1
            n |= (b & 0x7F) << shift
            shift += 7
            if b < 0x80:
                break
        out.append(buf[i : i + n])
        i += n
    return out


def test_the_agent_uses_it_unless_turned_off(compiled_loops: Loops) -> None:
    """Once built, the module's loop is the compiled one; PARALLAX_OTLP_WIRE_FAST=0 gives
    the reference, and says so (the agent's attach line carries otlp_wire.ENCODER)."""

    on = fresh_value("agent.export.otlp_wire", "ENCODER", {})
    assert on.startswith("OTLP spans: compiled"), on
    off = fresh_value("agent.export.otlp_wire", "ENCODER", {"PARALLAX_OTLP_WIRE_FAST": "0"})
    assert "Python" in off and "turned off (PARALLAX_OTLP_WIRE_FAST=0)" in off, off
