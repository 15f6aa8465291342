"""The one derivation of a pair (collector/pairing/rules.py) over rows made by the real
ingest parsers from generated OTLP spans and beacons — one hop, several hops, SDK + agent
twins, reconnects, WebSocket sequences, missing timings, LLM streams read by either side or
both: the parts a spec fixes by hand, a retried span read twice changes nothing, and the
query API shows what the pairer writes."""

from __future__ import annotations

import json
import math
import time
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from collector.api.query import detail
from collector.ingest import beacons, otlp
from collector.pairing import rules
from collector.pairing.rules import pairs_for
from collector.store.rows import EntryRow, PairRow, SpanRow

TRACE = bytes.fromhex("4bf92f3577b34da6a3ce929d0e0e4736")
BROWSER_SPAN = "00f067aa0ba902b7"
NOW_NS = time.time_ns()
ORIGIN_MS = NOW_NS / 1e6 - 60_000

maybe_us = st.one_of(st.none(), st.integers(0, 5_000_000))


@st.composite
def span_spec(draw: st.DrawFn) -> dict[str, Any]:
    return {
        "agent": draw(st.booleans()),
        "parent_is_browser": draw(st.integers(0, 5)) > 0,
        "ws_seq": draw(st.sampled_from([0, 0, 1, 2])),
        "start_ms": draw(st.floats(100, 400, allow_nan=False)),
        "dur_ms": draw(st.floats(0, 300, allow_nan=False)),
        "arrival_before_us": draw(maybe_us),
        "ttfb_us": draw(maybe_us),
        "ttft_us": draw(maybe_us),
        "recv_queue_us": draw(maybe_us),
        "srtt_us": draw(maybe_us),
        "retransmits": draw(st.one_of(st.none(), st.integers(0, 9))),
        "retransmit_wait_us": draw(maybe_us),
        "offsets": draw(st.lists(st.integers(0, 900_000), max_size=6).map(sorted)),
        "port": draw(st.sampled_from([0, 8000, 8080])),
        "host": draw(st.sampled_from(["", "node-a", "node-b"])),
        "service": draw(st.sampled_from(["app", "nginx"])),
        "route": draw(st.sampled_from([None, "/api/chat"])),
        "status": draw(st.sampled_from([None, 200, 503])),
        # the agent's write-to-wire holdback: (longest µs, reason) or not measured
        "hold": draw(
            st.one_of(
                st.none(),
                st.tuples(st.integers(0, 90_000), st.sampled_from(["", "nagle", "sndbuf"])),
            )
        ),
        # the agent read an LLM stream: some of its parallax_contracts.genai attributes
        "llm": draw(
            st.one_of(
                st.none(),
                st.fixed_dictionaries(
                    {"parallax.llm.dialect": st.sampled_from(["openai.chat", "ollama"])},
                    optional={
                        k: maybe_us.filter(lambda v: v is not None)
                        for k in (
                            "parallax.llm.queue_us",
                            "parallax.llm.prefill_us",
                            "parallax.llm.first_output_us",
                            "parallax.llm.last_output_us",
                            "parallax.llm.gap_p95_us",
                            "gen_ai.usage.output_tokens",
                        )
                    }
                    | {
                        "parallax.llm.end": st.sampled_from(["complete", "server_cut"]),
                        "gen_ai.response.model": st.sampled_from(["tiny", "m-2"]),
                    },
                ),
            )
        ),
    }


def _otlp(specs: list[dict[str, Any]]) -> bytes:
    req = ExportTraceServiceRequest()
    for i, sp_spec in enumerate(specs):
        rs = req.resource_spans.add()
        for k, v in (("service.name", sp_spec["service"]), ("host.name", sp_spec["host"])):
            kv = rs.resource.attributes.add()
            kv.key, kv.value.string_value = k, v
        sp = rs.scope_spans.add().spans.add()
        sp.trace_id = TRACE
        sp.span_id = bytes([1 + i]) * 8
        sp.parent_span_id = bytes.fromhex(
            BROWSER_SPAN if sp_spec["parent_is_browser"] else "11" * 8
        )
        sp.kind = Span.SpanKind.SPAN_KIND_SERVER
        sp.name = "GET /api/chat"
        t1 = int((ORIGIN_MS + sp_spec["start_ms"]) * 1e6)
        sp.start_time_unix_nano, sp.end_time_unix_nano = t1, t1 + int(sp_spec["dur_ms"] * 1e6)
        attrs: dict[str, Any] = {"url.path": "/api/chat", "http.request.method": "GET"}
        if sp_spec["agent"]:
            attrs["parallax.source"] = "ebpf"
        if sp_spec["arrival_before_us"] is not None:
            attrs["parallax.arrival_unix_ns"] = t1 - sp_spec["arrival_before_us"] * 1000
        for k in (
            "ttfb_us",
            "ttft_us",
            "recv_queue_us",
            "srtt_us",
            "retransmits",
            "retransmit_wait_us",
        ):
            if sp_spec.get(k) is not None:
                attrs[f"parallax.{k}"] = sp_spec[k]
        attrs.update(sp_spec.get("llm") or {})
        if sp_spec.get("hold") is not None:
            attrs["parallax.wire_hold.max_us"], why = sp_spec["hold"]
            if why:
                attrs["parallax.wire_hold.reason"] = why
        for k, v in (
            ("server.port", sp_spec["port"]),
            ("parallax.ws_seq", sp_spec["ws_seq"]),
            ("http.route", sp_spec["route"]),
            ("http.response.status_code", sp_spec["status"]),
        ):
            if v:
                attrs[k] = v
        for k, v in attrs.items():
            kv = sp.attributes.add()
            kv.key = k
            if isinstance(v, str):
                kv.value.string_value = v
            else:
                kv.value.int_value = v
        if sp_spec["offsets"]:
            kv = sp.attributes.add()
            kv.key = "parallax.chunk_offsets_us"
            for off in sp_spec["offsets"]:
                kv.value.array_value.values.add().int_value = off
    body: bytes = req.SerializeToString()
    return body


maybe_ms = st.one_of(st.none(), st.floats(0, 500, allow_nan=False))


@st.composite
def entry_spec(draw: st.DrawFn) -> dict[str, Any]:
    t0 = draw(st.one_of(st.none(), st.floats(100, 200, allow_nan=False)))
    base = t0 if t0 is not None else 100.0
    e: dict[str, Any] = {
        "trace_id": TRACE.hex(),
        "span_id": BROWSER_SPAN,
        "kind": draw(st.sampled_from(["fetch", "eventsource", "websocket"])),
        "seq": draw(st.sampled_from([0, 1, 2])),
        "url": "https://app.example/api/chat",
        "method": draw(st.sampled_from(["GET", "POST"])),
        "status": draw(st.sampled_from([None, 200])),
        "start_ms": 100.0 if t0 is None else min(100.0, t0),
        "coarse": draw(st.booleans()),
    }
    if t0 is not None:
        e["request_start_ms"] = t0
    for k in ("response_start_ms", "first_chunk_ms", "rendered_ms", "response_end_ms"):
        extra = draw(maybe_ms)
        if extra is not None:
            e[k] = base + extra
    chunks = draw(st.lists(st.floats(0, 500, allow_nan=False), max_size=6))
    if chunks:
        e["chunk_ms"] = sorted(base + c for c in chunks)
    if draw(st.booleans()):  # the probe read an LLM stream (beacon v2)
        tokens = sorted(base + c for c in draw(st.lists(st.floats(0, 500), max_size=6)))
        e["llm"] = {
            "dialect": draw(st.sampled_from(["openai.chat", "anthropic.messages"])),
            "tokens": len(tokens),
            "tokens_source": "events",
            **({"token_ms": tokens, "first_token_ms": tokens[0]} if tokens else {}),
            **({"gap_hist": draw(st.lists(st.integers(0, 3), min_size=56, max_size=56))}
               if draw(st.booleans()) else {}),
        }  # fmt: skip
    return {k: v for k, v in e.items() if v is not None}


def _eq(x: Any, y: Any) -> bool:
    """Equal values of the same type (floats bit for bit, lists element by element)."""
    if isinstance(x, list) and isinstance(y, list):
        return len(x) == len(y) and all(_eq(a, b) for a, b in zip(x, y, strict=True))
    if isinstance(x, float) and isinstance(y, float):
        return x == y or (math.isnan(x) and math.isnan(y))
    return bool(x == y and type(x) is type(y))


def _rows(
    spans: list[dict[str, Any]], entries: list[dict[str, Any]], drift: float | None
) -> tuple[list[SpanRow], list[EntryRow]]:
    now = time.time_ns()
    s_rows = otlp.parse(_otlp(spans), False, now, 0, now).rows
    doc: dict[str, Any] = {
        "v": 2 if any("llm" in e for e in entries) else 1,
        "site": "site-1",
        "session": "session-1",
        "page": "/",
        "time_origin": ORIGIN_MS,
        "entries": entries,
    }
    if drift is not None:
        doc["clock_drift_ms"] = drift
    e_parsed = beacons.parse(beacons.load(json.dumps(doc).encode()), now, 0, now)
    assert not e_parsed.rejected, e_parsed.rejected
    assert len(s_rows) == len(spans) and len(e_parsed.rows) == len(entries)
    return list(map(SpanRow._make, s_rows)), list(map(EntryRow._make, e_parsed.rows))


def _same(a: PairRow, b: PairRow) -> list[str]:
    return [n for n, x, y in zip(PairRow._fields, a, b, strict=True) if not _eq(x, y)]


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    spans=st.lists(span_spec(), min_size=1, max_size=4),
    entries=st.lists(entry_spec(), min_size=1, max_size=2),
    drift=st.one_of(st.none(), st.floats(-5000, 5000, allow_nan=False)),
)
def test_one_derivation_for_the_pairer_and_the_api(
    spans: list[dict[str, Any]], entries: list[dict[str, Any]], drift: float | None
) -> None:
    s_rows, e_rows = _rows(spans, entries, drift)
    version = 1_795_000_000_000_000_000
    pairs, one_sided = pairs_for([(s_rows, e_rows)], version)
    # A client's retried export read back twice before a merge: the same pairs.
    again, again_one_sided = pairs_for([(s_rows + s_rows, e_rows)], version)
    assert again_one_sided == one_sided
    assert len(again) == len(pairs)
    assert all(not _same(a, b) for a, b in zip(pairs, again, strict=True))
    # The trace is one-sided when its last entry found no span of its own.
    assert one_sided == ({TRACE.hex()} if not rules.candidates(e_rows[-1], s_rows) else set())
    by_spec = {bytes([1 + i]).hex() * 8: sp for i, sp in enumerate(spans)}
    shown = detail(TRACE.hex(), s_rows, e_rows).exchanges
    for e, spec in zip(e_rows, entries, strict=True):
        p = rules.pair(e, s_rows, version)
        if p is None:
            continue
        assert p in pairs
        t0, t3 = spec.get("request_start_ms"), spec.get("response_start_ms")
        assert p.user_ttfb_ms == (None if t0 is None or t3 is None else t3 - t0)
        assert len(p.user_itl_ms) == max(0, len(spec.get("chunk_ms", [])) - 1)
        origin = by_spec[p.hop_span_ids[-1]]
        ttfb_us = origin["ttfb_us"]
        # without the agent's TTFB, the span's duration (whole µs) stands in
        dur_us = int(origin["dur_ms"] * 1e6) // 1000
        want = (ttfb_us if ttfb_us is not None else dur_us) / 1000
        assert math.isclose(p.server_ttfb_ms or 0.0, want, abs_tol=1e-6)
        assert p.server_timed == (ttfb_us is not None)
        wait = by_spec[p.hop_span_ids[0]].get("retransmit_wait_us")  # the edge hop's
        assert p.retransmit_wait_ms == (None if wait is None else wait / 1000)
        assert math.isclose(sum(p.hop_added_ms), p.hop_added_ms[0] + sum(p.hop_added_ms[1:]))
    # The query API shows each exchange's parts as the pairer derives them.
    ordered = sorted(e_rows, key=lambda e: (e.time, e.seq))
    for e, ex in zip(ordered, shown, strict=True):
        p = rules.pair(e, s_rows, version) or rules.derive(e, [])
        parts = ex.parts.model_dump(exclude={"llm"})
        assert not [(k, v, getattr(p, k)) for k, v in parts.items() if not _eq(v, getattr(p, k))]


def test_due_marks_earlier_wins_and_nothing_is_taken_twice() -> None:
    from typing import cast

    from collector.metrics import Metrics
    from collector.pairing.pairer import Pairer
    from collector.store.client import Store

    p = Pairer(cast(Store, None), Metrics(), max_batch=3)  # marks never touch the store
    p.mark(["a", "b"], delay_s=0.3, attempt=1)
    p.mark(["c"])
    p.mark(["a"], delay_s=0.0, attempt=1)  # an earlier mark wins...
    p.mark(["c"], delay_s=0.3, attempt=1)  # ...a later one does not
    assert p._take_due() == [("c", 0), ("a", 1)]
    assert p._take_due() == []
    p.mark(["b"])  # re-marked for now: keeps the lower attempt of the two marks
    p.mark(["d", "e", "f", "g"])
    assert p._take_due() == [("b", 0), ("d", 0), ("e", 0)]  # max_batch
    assert p._take_due() == [("f", 0), ("g", 0)]
    time.sleep(0.35)
    assert p._take_due() == []  # b's delayed mark was superseded and taken
    p.mark(["h"], delay_s=0.05)
    time.sleep(0.1)
    assert p._take_due() == [("h", 0)]


def test_a_pair_is_written_again_only_when_its_spans_change() -> None:
    """The pairer rewrites a pair (with a higher version) when a hop or a linked SDK span
    joins it later, and not when the same spans are paired again."""
    from typing import cast

    from collector.metrics import Metrics
    from collector.pairing.pairer import Pairer
    from collector.store.client import Store

    def spec(**kw: Any) -> dict[str, Any]:
        base: dict[str, Any] = {
            "agent": True, "parent_is_browser": True, "ws_seq": 0, "start_ms": 110.0,
            "dur_ms": 200.0, "arrival_before_us": 100, "ttfb_us": 20_000, "ttft_us": None,
            "recv_queue_us": 50, "srtt_us": None, "retransmits": None, "offsets": [],
            "port": 8000, "host": "node-a", "service": "app", "route": None, "status": 200,
        }  # fmt: skip
        return {**base, **kw}

    now = time.time_ns()
    origin = spec()
    edge = spec(service="nginx", port=8080, start_ms=105.0, dur_ms=210.0)
    sdk_twin = spec(agent=False, start_ms=111.0, dur_ms=198.0)
    doc = {"v": 1, "site": "site-1", "session": "session-1", "time_origin": ORIGIN_MS,
           "entries": [{"trace_id": TRACE.hex(), "span_id": BROWSER_SPAN, "kind": "fetch",
                        "start_ms": 100.0, "request_start_ms": 101.0,
                        "response_start_ms": 140.0}]}  # fmt: skip
    parsed = beacons.parse(beacons.read(json.dumps(doc).encode()), now, 0, now).rows
    entry = list(map(EntryRow._make, parsed))
    p = Pairer(cast(Store, None), Metrics())  # _changed never touches the store

    def written(specs: list[dict[str, Any]]) -> int:
        rows = list(map(SpanRow._make, otlp.parse(_otlp(specs), False, now, 0, now).rows))
        pairs, _ = pairs_for([(rows, entry)], time.time_ns())
        fresh, memo = p._changed(pairs)
        p._remember(memo)
        return len(fresh)

    assert written([origin]) == 1
    assert written([origin]) == 0  # the same one hop again
    assert written([origin, sdk_twin]) == 1  # the app's SDK span, linked to the agent's
    assert written([origin, sdk_twin]) == 0
    assert written([edge, origin, sdk_twin]) == 1  # a proxy hop came
    assert written([edge, origin, sdk_twin]) == 0
