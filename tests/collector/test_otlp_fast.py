"""The compiled OTLP span decoder (collector/ingest/_otlp_fast.c) against the reference, the
Python path (otlp.parse_python), on the same bodies: hypothesis-generated
ExportTraceServiceRequests built with the real protobuf classes (agent-like spans with the
parallax.* attributes, SDK-like spans, odd value types, spans the reference rejects,
non-SERVER kinds, several resources), real OpenTelemetry SDK spans, the bench corpus, and
truncated or mutated bodies.

Wherever the decoder answers, its rows, trace ids and ignored count equal the reference's
(types included); it gives up (None) on every body in which the reference rejects a span
or which the reference refuses as malformed; on the plain cases it must not give up."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import Link, SpanKind, StatusCode

from bench.collector import _bodies
from collector.ingest import otlp
from collector.ingest.common import FUTURE_SLACK_NS, MAX_DURATION_NS, BadRequestError, Parsed
from collector.store import schema
from parallax_contracts import compiled
from parallax_contracts import span_attributes as sa

NOW = time.time_ns()
OLDEST = NOW - 86_400 * 10**9  # a one-day retention: older spans are rejected
DAY = 86_400 * 10**9
INT_NAMES = otlp._FAST_INTS
STR_NAMES = otlp._FAST_STRS
BOOL_NAMES = otlp._FLAGS
DOUBLE_NAMES = otlp._GPU_DOUBLES  # the GPU shares and means
OFFSETS = otlp._OFFSETS
K8S_NAMES = sa.RESOURCE_STORED  # the Resource's identity, kept in each row's attributes
SDK_NAMES = ("http.scheme", "user_agent.original", "network.peer.port", "net.host.name", "")
GPU_A = "GPU-8f2c0b1e-5a4d-4c3b-9a2f-0e1d2c3b4a59"
GPU_B = "GPU-1b2c3d4e-0000-4c3b-9a2f-0e1d2c3b4a5a"
GPU_COLS = [c.name for c in schema.SPAN_GPU_COLUMNS]
_GPU_AT = schema.column_names(schema.SPAN_COLUMNS).index(GPU_COLS[0])
TH_AT = schema.column_names(schema.SPAN_COLUMNS).index("sample_th")
# Trace states: the agent's (ot=th:…, trailing zeros dropped) and an SDK's other vendors'
# entries are the plain case; the odd ones the compiled decoder leaves to the reference.
PLAIN_TRACE_STATES = (
    "",
    "ot=th:0",
    "ot=th:e6666666",
    "ot=th:b3333333",
    "ot=th:ffffffffffffff",
    "vendor=x",
    "vendor=x,ot=th:8,other=1",
    "ot,ot=th:c",
)
ODD_TRACE_STATES = (
    "ot=th:ABC",
    "ot=th:",
    "ot=th:123456789abcdef",
    "ot=th:0;rv:abcdef01234567",
    "ot=rv:abcdef01234567;th:4",
    " ot=th:1",
    "x=y, ot=th:1",
    "ot=th:zz",
    "ot=th:8,ot=th:4",
    "ot=th:ß",
)
Fast = Callable[[bytes], tuple[list[tuple[Any, ...]], list[str], int] | None]


def _built_or_skip(source: Path) -> None:
    missing = compiled.toolchain_missing()
    if missing is not None:
        pytest.skip(missing)
    ok, msg = compiled.build(source)
    assert ok, msg


@pytest.fixture(scope="module")
def fast() -> Fast:
    """The compiled decoder, built here if setup has not (skipped only without a C
    toolchain: a build that fails where one exists is a failure)."""
    _built_or_skip(compiled.OTLP_SOURCE)
    from collector.ingest import _otlp_fast

    _otlp_fast.configure(otlp._FAST_NAMES, otlp._route, MAX_DURATION_NS, FUTURE_SLACK_NS)

    def run(body: bytes) -> tuple[list[tuple[Any, ...]], list[str], int] | None:
        return _otlp_fast.parse(body, NOW // 1_000_000, OLDEST, NOW)

    return run


def reference(body: bytes) -> Parsed | None:
    """The Python path's answer, or None where it refuses the body (400)."""
    try:
        return otlp.parse_python(body, False, NOW, OLDEST, NOW)
    except BadRequestError:
        return None


def same(a: Any, b: Any) -> bool:
    """Equal and of the same types all the way down (True == 1 would pass plain ==)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, tuple | list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    return bool(a == b)


def check(fast: Fast, body: bytes) -> bool:
    """Differential check of one body; True when the compiled decoder answered."""
    got = fast(body)
    ref = reference(body)
    if ref is None or ref.rejected_total:
        assert got is None, "answered where the reference refuses or rejects"
        return False
    if got is None:
        return False
    rows, tids, ignored = got
    assert len(rows) == len(ref.rows)
    for r, p in zip(rows, ref.rows, strict=True):
        assert same(r, p), f"\n fast {r}\n  ref {p}"
    assert same(tids, ref.trace_ids)
    assert ignored == ref.ignored
    return True


# --- strategies: attribute values ---------------------------------------------------------
I64 = st.integers(-(2**63), 2**63 - 1)
# Plain strings hold no NUL (a span storing one is rejected: invalid_string); odd values may.
TEXT = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=12)
NUL_TEXT = st.text(max_size=4).map(lambda s: s + "\x00")


def plain_int(name: str) -> st.SearchStrategy[int]:
    """Values the agent sends for an int attribute (the fast path's plain case)."""
    if name == "parallax.arrival_unix_ns":
        return st.integers(NOW - 10**12, NOW)
    if name.endswith("status_code"):
        return st.integers(100, 599)
    if name.endswith(".port"):
        return st.integers(0, 65535)
    if name.endswith("_launches"):
        return st.integers(0, 10**6)
    return st.integers(0, 10**8)


def plain_double(name: str) -> st.SearchStrategy[float]:
    """What the agent sends for a GPU double: a share in %, a coverage, a mean in flight."""
    hi = {"parallax.gpu.sample_coverage": 1.0, "parallax.gpu.inflight_mean": 500.0}
    return st.floats(0.0, hi.get(name, 100.0))


# Doubles the reference stores as absent (or converts): out of range, not finite, ints.
ODD_DOUBLE = st.one_of(
    st.floats(),
    st.sampled_from([-0.0, -1e-9, 100.0000001, 1.5, float("inf"), float("nan")]),
)


def odd_int(name: str) -> st.SearchStrategy[int]:
    """Ints that are still the right type: negative, huge, zero, the edges."""
    return st.one_of(
        I64, st.sampled_from([0, -1, 65535, 65536, 2**32 - 1, 2**32, 86_400_000_000 + 1])
    )


# A value is (kind, payload); fill() writes it into an AnyValue.
ODD_VALUE = st.one_of(
    st.tuples(st.just("str"), TEXT),
    st.tuples(st.just("str"), NUL_TEXT),
    st.tuples(st.just("int"), I64),
    st.tuples(st.just("bool"), st.booleans()),
    st.tuples(st.just("double"), st.floats()),
    st.tuples(st.just("bytes"), st.binary(max_size=6)),
    st.tuples(st.just("array"), st.lists(st.integers(-5, 10**6), max_size=4)),
    st.tuples(st.just("mixed"), st.lists(TEXT, min_size=1, max_size=3)),
    st.tuples(st.just("kvlist"), st.dictionaries(TEXT, TEXT, max_size=2)),
    st.tuples(st.just("empty"), st.none()),
)


def fill(av: AnyValue, value: tuple[str, Any]) -> None:
    kind, x = value
    if kind == "str":
        av.string_value = x
    elif kind == "int":
        av.int_value = x
    elif kind == "bool":
        av.bool_value = x
    elif kind == "double":
        av.double_value = x
    elif kind == "bytes":
        av.bytes_value = x
    elif kind == "array":
        av.array_value.SetInParent()
        for i in x:
            av.array_value.values.add().int_value = i
    elif kind == "mixed":
        av.array_value.values.add().int_value = 1
        for s in x:
            av.array_value.values.add().string_value = s
    elif kind == "kvlist":
        av.kvlist_value.SetInParent()
        for k, s in x.items():
            kv = av.kvlist_value.values.add()
            kv.key, kv.value.string_value = k, s
    # "empty": an AnyValue with no value set


@st.composite
def attribute(draw: st.DrawFn, odd: int) -> tuple[str, tuple[str, Any]]:
    """One span attribute: a slot's name with its type (or, now and then, anything)."""
    groups = ["int", "int", "str", "bool", "double", "offsets", "other", "other", "k8s"]
    group = draw(st.sampled_from(groups))
    if group == "int":
        name = draw(st.sampled_from(INT_NAMES))
        ints = odd_int(name) if rare(draw, odd) else plain_int(name)
        value: tuple[str, Any] = ("int", draw(ints))
    elif group == "str":
        name = draw(st.sampled_from(STR_NAMES))
        paths = st.sampled_from(
            ["/api/chat", "/v1/users/42?x=1", "", "GET", "post", "ß/x", GPU_A + "," + GPU_B]
        )
        value = ("str", draw(st.one_of(paths, TEXT)))
    elif group == "bool":
        name, value = draw(st.sampled_from(BOOL_NAMES)), ("bool", draw(st.booleans()))
    elif group == "double":
        name = draw(st.sampled_from(DOUBLE_NAMES))
        doubles = ODD_DOUBLE if rare(draw, odd) else plain_double(name)
        value = ("double", draw(doubles))
    elif group == "offsets":
        name = OFFSETS
        value = ("array", draw(st.lists(st.integers(0, 10**7), max_size=8)))
    elif group == "k8s":  # a span attribute named as an identity one: the Resource's wins
        name, value = draw(st.sampled_from(K8S_NAMES)), ("str", draw(TEXT))
    else:
        # (hypothesis also draws the string literals of the code under test: a slot's name)
        name = draw(st.one_of(st.sampled_from(SDK_NAMES), TEXT))
        if name in otlp._FAST_NAMES and not odd:
            name = SDK_NAMES[0]
        value = draw(st.one_of(st.tuples(st.just("str"), TEXT), st.tuples(st.just("int"), I64)))
    if rare(draw, odd // 2):
        value = draw(ODD_VALUE)
    return name, value


def rare(draw: st.DrawFn, pct: int) -> bool:
    """True pct % of the time (never when pct is 0: the plain case)."""
    return pct > 0 and draw(st.integers(0, 99)) < pct


def ids(draw: st.DrawFn, odd: int) -> tuple[bytes, bytes, bytes]:
    tid = draw(st.binary(min_size=16, max_size=16).filter(any))
    sid = draw(st.binary(min_size=8, max_size=8).filter(any))
    parent = draw(st.sampled_from([b"", draw(st.binary(min_size=8, max_size=8))]))
    if rare(draw, odd):
        tid = draw(st.sampled_from([bytes(16), tid[:15], b""]))
    if rare(draw, odd):
        sid = draw(st.sampled_from([bytes(8), sid + b"\x01", b""]))
    if rare(draw, odd):
        parent = parent[:3] or b"\x01"
    return tid, sid, parent


@st.composite
def span(draw: st.DrawFn, odd: int) -> Span:
    sp = Span()
    sp.trace_id, sp.span_id, sp.parent_span_id = ids(draw, odd)
    kinds = [Span.SpanKind.SPAN_KIND_SERVER] * 4 + [Span.SpanKind.SPAN_KIND_INTERNAL]
    if odd:
        kinds += [Span.SpanKind.SPAN_KIND_CLIENT, Span.SpanKind.SPAN_KIND_UNSPECIFIED]
    sp.kind = draw(st.sampled_from(kinds))
    sp.name = draw(st.one_of(st.sampled_from(["GET /api/chat", "handler", ""]), TEXT))
    if rare(draw, odd):
        sp.name = draw(NUL_TEXT)
    start = draw(st.integers(NOW - 10**12, NOW))
    dur = draw(st.integers(0, 10**10))
    if rare(draw, odd):
        start = draw(st.sampled_from([NOW - 2 * DAY, NOW + 2 * DAY, 0]))
    if rare(draw, odd):
        dur = draw(st.sampled_from([-1, DAY + 1, DAY]))
    sp.start_time_unix_nano, sp.end_time_unix_nano = start, max(0, start + dur)
    for name, value in draw(st.lists(attribute(odd), max_size=30)):
        kv = sp.attributes.add()
        kv.key = name
        fill(kv.value, value)
    # What SDKs add: a status, a trace state, flags, events, links.
    if draw(st.booleans()):
        sp.status.code = Status.STATUS_CODE_ERROR
        sp.status.message = draw(TEXT)
    sp.trace_state = draw(st.sampled_from(PLAIN_TRACE_STATES))
    if rare(draw, odd):
        sp.trace_state = draw(st.one_of(st.sampled_from(ODD_TRACE_STATES), TEXT))
    if draw(st.booleans()):
        sp.flags = 0x101
        ev = sp.events.add()
        ev.time_unix_nano, ev.name = start, draw(TEXT)
        fill(ev.attributes.add().value, draw(ODD_VALUE))
        link = sp.links.add()
        link.trace_id, link.span_id = os.urandom(16), os.urandom(8)
    return sp


@st.composite
def request(draw: st.DrawFn, odd: bool) -> bytes:
    """A request; odd: each choice goes astray with a drawn probability (1 % to 30 %)."""
    pct = draw(st.sampled_from([1, 3, 10, 30])) if odd else 0
    req = ExportTraceServiceRequest()
    for _ in range(draw(st.integers(1, 3))):
        rs = req.resource_spans.add()
        res: list[tuple[str, tuple[str, Any]]] = [
            ("service.name", ("str", draw(st.sampled_from(["app", "", "ß-svc"])))),
            ("host.name", ("str", draw(st.sampled_from(["node-1", ""])))),
            ("process.pid", ("int", draw(st.integers(-5, 2**31)))),
            ("telemetry.sdk.language", ("str", "python")),
        ]
        res = draw(st.lists(st.sampled_from(res), max_size=5))
        if draw(st.booleans()):  # an agent's Kubernetes identity (some of it, any order)
            res += draw(st.lists(k8s_attribute(), max_size=len(K8S_NAMES) + 2))
        if rare(draw, pct):
            res += draw(st.lists(st.tuples(st.sampled_from(["service.name", "x"]), ODD_VALUE)))
        if rare(draw, pct):  # odd identity values: other types, a NUL, empty
            res += draw(st.lists(st.tuples(st.sampled_from(K8S_NAMES), ODD_VALUE), min_size=1))
        if draw(st.booleans()):
            res = draw(st.permutations(res))
        for k, v in res:
            kv = rs.resource.attributes.add()
            kv.key = k
            fill(kv.value, v)
        for _ in range(draw(st.integers(1, 2))):
            ss = rs.scope_spans.add()
            ss.scope.name, ss.scope.version = draw(TEXT), "1.0"
            ss.spans.extend(draw(st.lists(span(pct), min_size=1, max_size=4)))
    body: bytes = req.SerializeToString()
    return body


def k8s_attribute() -> st.SearchStrategy[tuple[str, tuple[str, Any]]]:
    """One identity attribute as the agent sends it: a string (repeats allowed)."""
    values = st.one_of(
        st.sampled_from(["shop", "chat-7c9d6b5f4-x2x9q", "a" * 64, "node-1", "", "ß"]), TEXT
    )
    return st.tuples(st.sampled_from(K8S_NAMES), st.tuples(st.just("str"), values))


FAST_SETTINGS = settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)


@FAST_SETTINGS
@given(body=request(odd=True))
def test_odd_requests_equal_the_reference_or_give_up(fast: Fast, body: bytes) -> None:
    check(fast, body)


@FAST_SETTINGS
@given(body=request(odd=False))
def test_plain_requests_take_the_fast_path(fast: Fast, body: bytes) -> None:
    ref = reference(body)
    assert ref is not None and not ref.rejected_total
    assert check(fast, body), "gave up on a plain request"


def test_bench_corpus_takes_the_fast_path(fast: Fast) -> None:
    spans, _ = _bodies(1500, 3)
    assert spans
    for body in spans:
        assert check(fast, body)


def sdk_body(resource: dict[str, Any] | None = None) -> bytes:
    """Spans from the real OpenTelemetry SDK, encoded by its OTLP exporter's encoder: SERVER
    spans with HTTP attributes, an event and a status, INTERNAL children with a link."""
    exp = InMemorySpanExporter()
    res = {"service.name": "shop", "process.pid": 7, **(resource or {})}
    tp = TracerProvider(resource=Resource.create(res))
    tp.add_span_processor(SimpleSpanProcessor(exp))
    tracer = tp.get_tracer("test.scope", "1.2")
    for i in range(20):
        with tracer.start_as_current_span(
            "GET /items/{id}",
            kind=SpanKind.SERVER,
            attributes={
                "http.request.method": "GET",
                "url.path": f"/items/{i}",
                "http.route": "/items/{id}",
                "http.response.status_code": 200 + i % 2,
                "server.port": 8080,
                "network.peer.port": 50000 + i,  # an int outside the slots
                "user_agent.original": "curl/8",
            },
        ) as s:
            s.add_event("chunk", {"n": i})
            s.set_status(StatusCode.OK)
            with tracer.start_as_current_span("db", links=[Link(s.get_span_context())]):
                pass
    tp.shutdown()
    body: bytes = encode_spans(exp.get_finished_spans()).SerializeToString()
    return body


def test_real_sdk_spans_take_the_fast_path(fast: Fast) -> None:
    body = sdk_body()
    assert check(fast, body)
    got = fast(body)
    assert got is not None and len(got[0]) == 20 and got[2] == 20


# An agent's Resource in Kubernetes (agent/identity/resource.py), the identity in full.
K8S_RESOURCE = {
    "host.name": "node-a",
    sa.RESOURCE_CONTAINER_ID: "3f2a" * 16,
    sa.RESOURCE_K8S_NODE_NAME: "node-a",
    sa.RESOURCE_K8S_NAMESPACE_NAME: "shop",
    sa.RESOURCE_K8S_POD_NAME: "chat-7c9d6b5f4-x2x9q",
    sa.RESOURCE_K8S_POD_UID: "0b6d2a8e-63f1-4f7e-9b3a-5d2c1e0f9a87",
    sa.RESOURCE_K8S_CONTAINER_NAME: "chat",
    sa.RESOURCE_K8S_REPLICASET_NAME: "chat-7c9d6b5f4",
    sa.RESOURCE_K8S_DEPLOYMENT_NAME: "chat",
    sa.RESOURCE_K8S_STATEFULSET_NAME: "db",
    sa.RESOURCE_K8S_DAEMONSET_NAME: "agent",
    sa.RESOURCE_K8S_JOB_NAME: "nightly-28934100",
    sa.RESOURCE_K8S_CRONJOB_NAME: "nightly",
}


def test_real_sdk_k8s_resource_takes_the_fast_path(fast: Fast) -> None:
    """The SDK's Resource with the identity: every SERVER row carries it in ``attributes``
    (after the span's own), on both decoders; the SDK's telemetry.sdk.* are not stored."""
    body = sdk_body(K8S_RESOURCE)
    assert check(fast, body)
    ref = reference(body)
    assert ref is not None and len(ref.rows) == 20
    want = {k: v for k, v in K8S_RESOURCE.items() if k in sa.RESOURCE_STORED}
    assert set(want) == set(sa.RESOURCE_STORED)
    for row in ref.rows:
        attrs = row[36]
        assert list(attrs)[:2] == ["network.peer.port", "user_agent.original"]
        assert {k: attrs[k] for k in list(attrs)[2:]} == want
        assert row[9] == "node-a" and row[8] == "shop"


def _k8s_body(res: list[tuple[str, tuple[str, Any]]], span_attrs: dict[str, str]) -> bytes:
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    for k, v in res:
        kv = rs.resource.attributes.add()
        kv.key = k
        fill(kv.value, v)
    sp = rs.scope_spans.add().spans.add()
    sp.trace_id, sp.span_id, sp.kind = os.urandom(16), os.urandom(8), Span.SPAN_KIND_SERVER
    sp.start_time_unix_nano, sp.end_time_unix_nano = NOW - 10**9, NOW
    for k, s in span_attrs.items():
        kv = sp.attributes.add()
        kv.key, kv.value.string_value = k, s
    body: bytes = req.SerializeToString()
    return body


def test_k8s_identity_rules(fast: Fast) -> None:
    """The rules for the identity, on both decoders: the Resource's value wins over a span
    attribute of the same name (which stays where the Resource has none); a later duplicate
    in the Resource replaces; only string values are kept (the compiled decoder leaves the
    others to the reference); a NUL in one rejects the Resource's SERVER spans
    (invalid_string); other Resource attributes are not stored."""
    pod, ns = sa.RESOURCE_K8S_POD_NAME, sa.RESOURCE_K8S_NAMESPACE_NAME

    def row_attrs(res: list[tuple[str, tuple[str, Any]]], span: dict[str, str]) -> Any:
        body = _k8s_body(res, span)
        ref = reference(body)
        assert ref is not None
        answered = check(fast, body)
        return (ref.rows[0][36] if ref.rows else ref.rejected), answered

    assert row_attrs([(pod, ("str", "p1")), (ns, ("str", "shop"))], {pod: "app", "x": "1"}) == (
        {pod: "p1", "x": "1", ns: "shop"},
        True,
    )
    assert row_attrs([(ns, ("str", "shop"))], {pod: "app"}) == ({pod: "app", ns: "shop"}, True)
    assert row_attrs([(pod, ("str", "a")), (ns, ("str", "")), (pod, ("str", "b"))], {}) == (
        {pod: "b", ns: ""},
        True,
    )
    assert row_attrs(
        [("process.executable.name", ("str", "py")), ("k8s.pod.labels", ("str", "x"))], {}
    ) == ({}, True)
    for odd in (
        ("int", 7),
        ("bool", True),
        ("array", [1]),
        ("kvlist", {"a": "b"}),
        ("empty", None),
    ):
        assert row_attrs([(pod, odd), (ns, ("str", "shop"))], {}) == ({ns: "shop"}, False), odd
    assert row_attrs([(pod, ("str", "p\x00"))], {}) == ({"invalid_string": 1}, False)
    # A NUL in a span attribute the Resource's value would replace: still invalid_string.
    assert row_attrs([(pod, ("str", "p1"))], {pod: "\x00"}) == ({"invalid_string": 1}, False)


def test_rejections_give_up(fast: Fast) -> None:
    """One rejected span in an otherwise plain body: the whole body goes to the reference."""
    good = ExportTraceServiceRequest()
    rs = good.resource_spans.add()
    sp = rs.scope_spans.add().spans.add()
    sp.trace_id, sp.span_id, sp.kind = os.urandom(16), os.urandom(8), Span.SPAN_KIND_SERVER
    sp.start_time_unix_nano, sp.end_time_unix_nano = NOW - 10**9, NOW
    assert check(fast, good.SerializeToString())

    def rejected(edit: Callable[[Span], None]) -> None:
        bad = ExportTraceServiceRequest()
        bad.CopyFrom(good)
        edit(bad.resource_spans[0].scope_spans[0].spans.add())
        body = bad.SerializeToString()
        ref = reference(body)
        assert ref is not None and ref.rejected_total == 1 and len(ref.rows) == 1
        assert fast(body) is None

    def attr(name: str, value: int | str) -> Callable[[Span], None]:
        def edit(s: Span) -> None:
            s.CopyFrom(sp)
            kv = s.attributes.add()
            kv.key = name
            if isinstance(value, int):
                kv.value.int_value = value
            else:
                kv.value.string_value = value

        return edit

    rejected(lambda s: s.CopyFrom(sp) or setattr(s, "trace_id", bytes(16)))  # type: ignore[func-returns-value]
    rejected(attr("parallax.ttfb_us", -1))
    rejected(attr("parallax.duration_us", 86_400_000_001))
    rejected(attr("parallax.chunks", 2**32))

    # A NUL in any string the row stores: rejected as invalid_string (the beacon's rule).
    rejected(lambda s: s.CopyFrom(sp) or setattr(s, "name", "GET /\x00"))  # type: ignore[func-returns-value]
    rejected(attr("url.path", "/a\x00b"))
    rejected(attr("http.route", "\x00"))
    rejected(attr("custom\x00key", "v"))
    rejected(attr("custom", "v\x00"))
    nul_service = ExportTraceServiceRequest()
    nul_service.CopyFrom(good)
    kv = nul_service.resource_spans[0].resource.attributes.add()
    kv.key, kv.value.string_value = "service.name", "app\x00"
    ref = reference(nul_service.SerializeToString())
    assert ref is not None and ref.rejected == {"invalid_string": 1} and not ref.rows
    assert fast(nul_service.SerializeToString()) is None


def test_truncated_bodies_give_up_or_equal(fast: Fast) -> None:
    """Every prefix of a request (cut mid-varint, mid-field, mid-message): no crash, and an
    answer only where the reference answers the same."""
    spans, _ = _bodies(3, 5)
    sdk = sdk_body()[:3000]  # (the first spans: every prefix is parsed twice)
    for body in (spans[0], sdk):
        for cut in range(len(body)):
            check(fast, body[:cut])


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    body=request(odd=True),
    edits=st.lists(st.tuples(st.integers(0, 10**6), st.binary(max_size=3)), min_size=1, max_size=4),
)
def test_mutated_bodies_give_up_or_equal(
    fast: Fast, body: bytes, edits: list[tuple[int, bytes]]
) -> None:
    """Random bytes written over, inserted into or cut out of a generated body."""
    assume(body)
    b = bytearray(body)
    for pos, data in edits:
        i = pos % (len(b) + 1)
        if pos % 3 == 0:
            b[i : i + len(data)] = data
        elif pos % 3 == 1:
            b[i:i] = data
        else:
            del b[i : i + 1 + len(data)]
    check(fast, bytes(b))


@settings(max_examples=300, deadline=None)
@given(body=st.binary(max_size=200))
def test_garbage_gives_up_or_equals(fast: Fast, body: bytes) -> None:
    check(fast, body)


def test_deep_nesting_gives_up_or_equals(fast: Fast) -> None:
    """Attribute values nested deep (arrays of arrays), in a resource attribute (only checked
    by the decoder) and a span attribute: equal to the reference or given up, up to far past
    the protobuf runtime's own depth limit (a 400 then), and no crash."""
    for depth in (1, 5, 15, 16, 17, 30, 45, 60, 2000):
        av = b"\x0a\x01x"  # AnyValue{string_value: "x"}
        for _ in range(depth):
            arr = b"\x0a" + _varint(len(av)) + av  # ArrayValue{values: [av]}
            av = b"\x2a" + _varint(len(arr)) + arr  # AnyValue{array_value: arr}
        kv = b"\x0a\x04deep\x12" + _varint(len(av)) + av  # KeyValue{key, value}
        for in_span in (False, True):
            req = ExportTraceServiceRequest()
            rs = req.resource_spans.add()
            sp = rs.scope_spans.add().spans.add()
            sp.trace_id, sp.span_id, sp.kind = os.urandom(16), os.urandom(8), Span.SPAN_KIND_SERVER
            sp.start_time_unix_nano, sp.end_time_unix_nano = NOW - 10**9, NOW
            body = req.SerializeToString()
            if in_span:  # appended to the span: fields may repeat, messages concatenate
                sp_b = sp.SerializeToString() + b"\x4a" + _varint(len(kv)) + kv
                ss_b = b"\x12" + _varint(len(sp_b)) + sp_b
                rs_b = b"\x12" + _varint(len(ss_b)) + ss_b
            else:
                res = b"\x0a" + _varint(len(kv)) + kv  # Resource.attributes
                rs_b = rs.SerializeToString() + b"\x0a" + _varint(len(res)) + res
            body = b"\x0a" + _varint(len(rs_b)) + rs_b
            answered = check(fast, body)
            assert answered == (not in_span and depth < 16), (depth, in_span)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes(out)


def test_parse_uses_the_compiled_decoder_and_falls_back() -> None:
    """otlp.parse: the compiled decoder when built (else said in DECODER), the reference for
    what it gives up on (a rejected span is counted), and PARALLAX_OTLP_FAST=0 turns it off."""
    _built_or_skip(compiled.OTLP_SOURCE)
    code = "from collector.ingest import otlp; print(otlp.DECODER)"
    root = Path(__file__).resolve().parents[2]
    for env, want in (({}, "compiled"), ({"PARALLAX_OTLP_FAST": "0"}, "pure Python")):
        p = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=root,
            env={**os.environ, **env},
        )
        assert p.returncode == 0, p.stderr
        assert want in p.stdout, p.stdout
    req = ExportTraceServiceRequest()
    sp = req.resource_spans.add().scope_spans.add().spans.add()
    sp.trace_id, sp.span_id, sp.kind = bytes(16), os.urandom(8), Span.SPAN_KIND_SERVER
    out = otlp.parse(req.SerializeToString(), False, NOW, OLDEST, NOW)
    assert out.rejected == {"invalid_trace_id": 1} and not out.rows


def test_build_without_headers_says_so(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No Python.h (a Python without its headers): one line saying so, nothing raised, and
    the existing build left alone (the collector then parses in Python)."""
    so = compiled.target(compiled.OTLP_SOURCE)
    before = so.stat().st_mtime if so.exists() else None
    monkeypatch.setattr("sysconfig.get_paths", lambda: {"include": str(tmp_path)})
    ok, msg = compiled.build(compiled.OTLP_SOURCE, force=True)
    assert not ok and "Python.h not found" in msg and "\n" not in msg
    after = so.stat().st_mtime if so.exists() else None
    assert after == before


def _gpu_span(attrs: dict[str, tuple[str, Any]]) -> bytes:
    req = ExportTraceServiceRequest()
    sp = req.resource_spans.add().scope_spans.add().spans.add()
    sp.trace_id, sp.span_id, sp.kind = os.urandom(16), os.urandom(8), Span.SPAN_KIND_SERVER
    sp.start_time_unix_nano, sp.end_time_unix_nano = NOW - 10**9, NOW
    for name, value in {"parallax.ttft_us": ("int", 840_000), **attrs}.items():
        kv = sp.attributes.add()
        kv.key = name
        fill(kv.value, value)
    body: bytes = req.SerializeToString()
    return body


def _gpu_of(row: tuple[Any, ...]) -> dict[str, Any]:
    return dict(zip(GPU_COLS, row[_GPU_AT : _GPU_AT + len(GPU_COLS)], strict=True))


def test_gpu_attributes_fill_their_columns(fast: Fast) -> None:
    """The agent's parallax.gpu.* attributes land in the GPU columns with their types, on
    both decoders; absent ones are NULL (and the UUID ''), never 0; none of them is left in
    the attributes map."""
    body = _gpu_span(
        {
            "parallax.gpu.prefill_launches": ("int", 40),
            "parallax.gpu.decode_launches": ("int", 0),
            "parallax.gpu.prefill_wait_us": ("int", 100_000),
            "parallax.gpu.prefill_sm_util_pct": ("double", 97.25),
            "parallax.gpu.decode_sm_util_pct": ("double", 0.0),
            "parallax.gpu.sample_coverage": ("double", 0.875),
            "parallax.gpu.inflight_mean": ("double", 14.0),
            "parallax.gpu.uuid": ("str", f"{GPU_A},{GPU_B}"),
        }
    )
    assert check(fast, body), "gave up on an agent's GPU span"
    ref = reference(body)
    assert ref is not None
    row = ref.rows[0]
    assert len(row) == len(schema.SPAN_COLUMNS)
    assert _gpu_of(row) == {
        "gpu_prefill_launches": 40,
        "gpu_decode_launches": 0,
        "gpu_prefill_wait_us": 100_000,
        "gpu_decode_wait_us": None,  # absent: not measured, not zero
        "gpu_prefill_sm_util_pct": 97.25,
        "gpu_decode_sm_util_pct": 0.0,
        "gpu_sample_coverage": 0.875,
        "gpu_inflight_mean": 14.0,
        "gpu_uuid": f"{GPU_A},{GPU_B}",
    }
    assert row[36] == {}  # the attributes map
    plain = reference(_gpu_span({}))
    assert plain is not None
    assert _gpu_of(plain.rows[0]) == {c: None for c in GPU_COLS[:-1]} | {"gpu_uuid": ""}


def test_gpu_values_outside_their_domain_are_absent(fast: Fast) -> None:
    """A negative count or wait, a share over 100 % or under 0, a coverage over 1, NaN or
    infinity, another type: that column NULL, the span kept with its timings (the compiled
    decoder leaves such bodies to the reference). An int where a double is due, and a whole
    float where an int is due, are converted."""
    cases: list[tuple[str, tuple[str, Any], Any]] = [
        ("parallax.gpu.prefill_launches", ("int", -1), None),
        ("parallax.gpu.prefill_launches", ("int", 2**32), None),
        ("parallax.gpu.prefill_launches", ("double", 12.0), 12),
        ("parallax.gpu.decode_wait_us", ("int", -5), None),
        ("parallax.gpu.decode_wait_us", ("str", "250"), 250),
        ("parallax.gpu.prefill_sm_util_pct", ("double", 100.5), None),
        ("parallax.gpu.prefill_sm_util_pct", ("double", -0.5), None),
        ("parallax.gpu.prefill_sm_util_pct", ("int", 55), 55.0),
        ("parallax.gpu.decode_sm_util_pct", ("double", float("nan")), None),
        ("parallax.gpu.sample_coverage", ("double", 1.01), None),
        ("parallax.gpu.sample_coverage", ("str", "0.5"), None),
        ("parallax.gpu.inflight_mean", ("double", float("inf")), None),
        ("parallax.gpu.inflight_mean", ("bool", True), None),
        ("parallax.gpu.uuid", ("int", 7), ""),
    ]
    col = {a: c for a, c in zip(otlp._GPU_NAMES, GPU_COLS, strict=True)}
    for name, value, want in cases:
        body = _gpu_span({name: value})
        ref = reference(body)
        assert ref is not None and len(ref.rows) == 1 and not ref.rejected_total, name
        got = _gpu_of(ref.rows[0])[col[name]]
        assert got == want and type(got) is type(want), (name, value, got)
        assert ref.rows[0][23] == 840_000  # ttft_us kept
        check(fast, body)


def _traced_span(trace_state: str) -> bytes:
    req = ExportTraceServiceRequest()
    sp = req.resource_spans.add().scope_spans.add().spans.add()
    sp.trace_id, sp.span_id, sp.kind = os.urandom(16), os.urandom(8), Span.SPAN_KIND_SERVER
    sp.start_time_unix_nano, sp.end_time_unix_nano = NOW - 10**9, NOW
    sp.trace_state = trace_state
    body: bytes = req.SerializeToString()
    return body


def test_trace_state_threshold_on_both_decoders(fast: Fast) -> None:
    """The span's sampling threshold (tracestate ot=th:…, the 56-bit value padded on the
    right) in ``sample_th``, the same on both decoders; a span stating none — no tracestate,
    other vendors only, an invalid th — reads 0 (kept with probability 1). The compiled
    decoder answers the agent's form and leaves the rest to the reference."""
    want = {
        "": 0,
        "ot=th:0": 0,
        "ot=th:e6666666": 0xE6666666 << 24,
        "ot=th:b3333333": 0xB3333333 << 24,
        "ot=th:8": 1 << 55,
        "ot=th:ffffffffffffff": (1 << 56) - 1,
        "vendor=x,ot=th:8,other=1": 1 << 55,
        "vendor=x": 0,
        "ot=th:ABC": 0,  # not lowercase hex: says nothing about sampling
        "ot=th:0;rv:abcdef01234567": 0,
        "ot=rv:abcdef01234567;th:4": 1 << 54,
        " ot=th:1 ": 1 << 52,
        "ot=th:123456789abcdef": 0,  # 15 digits: invalid
    }
    for ts, th in want.items():
        body = _traced_span(ts)
        ref = reference(body)
        assert ref is not None and len(ref.rows) == 1, ts
        got = ref.rows[0][TH_AT]
        assert got == th and type(got) is int, (ts, got, th)
        answered = check(fast, body)
        assert answered == (ts in PLAIN_TRACE_STATES or ts in ("ot=th:8",)), ts
