"""LLM streams through a real collector (subprocess, real chDB, the real query app and SLA
plugin): agent-like SERVER spans carrying the parallax_contracts.genai attributes, exported by
the real OpenTelemetry SDK, and beacon v2 entries carrying the probe's ``llm`` object, for an
LLM route behind a proxy that coalesces tokens and whose engine queues a third of the
answers; beside it a chunked CSV download in no dialect.

Checked: the stored columns of spans, entries and pairs (absent stays absent: NULL, '', []),
the query API's llm objects, the SLA checker comparing first tokens and token gaps and
naming the engine's queue in tokens (the CSV route keeps its words), the GenAI client
histograms on /metrics (promtool-clean), and the SLA page's server block in tokens."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags
from prometheus_client.parser import text_string_to_metric_families

from parallax_contracts.trace_context import new_span_id, new_trace_id
from tests import prom_tools
from tests.collector.helpers import (
    Running,
    post_beacon,
    run_store_script,
    start_collector,
    wait_for,
)

N = 100  # answers per route: a P95's 97.5 % bounds are both finite from 100
LLM_ROUTE, LLM_SERVICE = "/v1/chat/completions", "llama_cpp.server"
CSV_ROUTE, CSV_SERVICE = "/export.csv", "app"
TOKENS = 100
GAP_US = 11_000  # the engine writes a token every 11 ms
PREFILL_US = 95_000
QUEUE_US = 1_300_000  # every third answer waits this long behind another stream
NET_MS = 20.0  # the network's share of the user's first token (both ways)
BURST, BURST_GAP_MS = 5, 55.0  # the proxy lets tokens through 5 at a time, every 55 ms
PAINT_MS = 7.0  # the answer's paint after its first token (the probe's rendered_ms)
GAP_HIST = [0] * 26 + [4] + [0] * 29  # one long answer: 4 gaps past its 1024th token
SLA_YAML = "for: 0s\ninterval: 1s\n"
UNQUEUED = sum(1 for i in range(N) if i % 3)


@dataclass
class Sent:
    llm: list[tuple[str, str]] = field(default_factory=list)  # (trace id, browser span id)
    csv: list[tuple[str, str]] = field(default_factory=list)


def _llm_attrs(i: int) -> tuple[dict[str, Any], int, int]:
    """The agent's attributes of answer i, its first token (µs from t1) and duration."""
    queue = QUEUE_US if i % 3 == 0 else 0
    first = queue + PREFILL_US
    offsets = [first + k * GAP_US for k in range(TOKENS)]
    duration = offsets[-1] + 1_000
    attrs: dict[str, Any] = {
        "url.path": LLM_ROUTE,
        "http.request.method": "POST",
        "http.response.status_code": 200,
        "parallax.source": "ebpf",
        "parallax.ttfb_us": 500,
        "parallax.ttft_us": first,
        "parallax.duration_us": duration,
        "parallax.chunk_offsets_us": [500, *offsets],
        "parallax.chunks": TOKENS + 1,
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "llama.cpp",
        "gen_ai.response.model": "tiny-random",
        "gen_ai.response.finish_reasons": ["stop"],
        "gen_ai.usage.input_tokens": 12,
        "gen_ai.usage.output_tokens": TOKENS,
        "gen_ai.request.stream": True,
        "gen_ai.response.time_to_first_chunk": first / 1e6,
        "parallax.llm.dialect": "openai.chat",
        "parallax.llm.first_output_us": first,
        "parallax.llm.last_output_us": offsets[-1],
        "parallax.llm.output_tokens_source": "usage",
        "parallax.llm.content_events": TOKENS,
        "parallax.llm.token_offsets_us": offsets,
        "parallax.llm.gaps": TOKENS - 1,
        "parallax.llm.gap_p50_us": GAP_US,
        "parallax.llm.gap_p95_us": GAP_US,
        "parallax.llm.gap_p99_us": GAP_US,
        "parallax.llm.gap_max_us": GAP_US,
        "parallax.llm.gap_max_index": 1,
        "parallax.llm.gaps_exact": True,
        "parallax.llm.queue_us": queue,
        "parallax.llm.prefill_us": PREFILL_US,
        "parallax.llm.end": "complete",
    }
    return attrs, first, duration


def _csv_attrs() -> tuple[dict[str, Any], int, int]:
    offsets = [3_000 + k * 2_000 for k in range(50)]
    attrs: dict[str, Any] = {
        "url.path": CSV_ROUTE,
        "http.request.method": "GET",
        "http.response.status_code": 200,
        "parallax.source": "ebpf",
        "parallax.ttfb_us": 500,
        "parallax.ttft_us": offsets[0],
        "parallax.duration_us": offsets[-1],
        "parallax.chunk_offsets_us": offsets,
        "parallax.chunks": len(offsets),
    }
    return attrs, offsets[0], offsets[-1]


def _span(
    tp: TracerProvider, tid: str, bsid: str, attrs: dict[str, Any], t1_ns: int, dur_us: int
) -> None:
    parent = SpanContext(int(tid, 16), int(bsid, 16), True, TraceFlags(1))
    ctx = trace.set_span_in_context(NonRecordingSpan(parent))
    name = f"{attrs['http.request.method']} {attrs['url.path']}"
    attrs = {**attrs, "parallax.arrival_unix_ns": t1_ns - 100_000}
    sp = tp.get_tracer("agent-like").start_span(
        name, context=ctx, kind=SpanKind.SERVER, attributes=attrs, start_time=t1_ns
    )
    sp.end(end_time=t1_ns + dur_us * 1000)


def _entry(tid: str, bsid: str, url: str, t0: float, **kw: Any) -> dict[str, Any]:
    return {
        "trace_id": tid,
        "span_id": bsid,
        "kind": "fetch",
        "method": "POST" if "chat" in url else "GET",
        "url": url,
        "status": 200,
        "start_ms": t0 - 1.0,
        "request_start_ms": t0,
        "response_start_ms": t0 + NET_MS + 0.5,
        **kw,
    }


def _send(c: Running) -> Sent:
    sent = Sent()
    tps = {
        svc: TracerProvider(resource=Resource.create({"service.name": svc, "host.name": "n1"}))
        for svc in (LLM_SERVICE, CSV_SERVICE)
    }
    for tp in tps.values():
        tp.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(f"{c.ingest}/v1/traces")))
    origin = time.time() * 1000 - 120_000  # the page's time zero, 2 min ago
    llm_entries, csv_entries = [], []
    for i in range(N):
        t0 = 1_000.0 + i * 500.0  # the browser's request start (ms after time_origin)
        t1_ns = int((origin + t0 + NET_MS / 2) * 1e6)  # the app reads it δ/2 later
        tid, bsid = new_trace_id(), new_span_id()
        attrs, first_us, dur = _llm_attrs(i)
        _span(tps[LLM_SERVICE], tid, bsid, attrs, t1_ns, dur)
        first_ms = t0 + NET_MS + first_us / 1000.0
        tokens = [first_ms + (k // BURST) * BURST_GAP_MS + (k % BURST) * 0.1 for k in range(TOKENS)]
        llm = {
            "dialect": "openai.chat",
            "first_token_ms": first_ms,
            "first_output_ms": first_ms,
            "token_ms": tokens,
            "tokens": TOKENS,
            "tokens_source": "usage",
            "end": "complete",
            **({"gap_hist": GAP_HIST} if i == 0 else {}),
        }
        first_chunk = t0 + NET_MS + 0.5  # the role-only delta: no token
        llm_entries.append(
            _entry(tid, bsid, f"http://chat.test{LLM_ROUTE}", t0, first_chunk_ms=first_chunk,
                   rendered_ms=first_ms + PAINT_MS, response_end_ms=tokens[-1] + 1.0, llm=llm)
        )  # fmt: skip
        sent.llm.append((tid, bsid))
        tid, bsid = new_trace_id(), new_span_id()
        attrs, first_us, dur = _csv_attrs()
        _span(tps[CSV_SERVICE], tid, bsid, attrs, t1_ns + 250_000_000, dur)
        t0c = t0 + 250.0
        chunks = [t0c + NET_MS + off / 1000.0 for off in attrs["parallax.chunk_offsets_us"]]
        csv_entries.append(
            _entry(tid, bsid, f"http://chat.test{CSV_ROUTE}", t0c, first_chunk_ms=chunks[0],
                   chunk_ms=chunks, chunks=len(chunks), response_end_ms=chunks[-1])
        )  # fmt: skip
        sent.csv.append((tid, bsid))
    for tp in tps.values():
        tp.shutdown()
    for batch in range(0, N, 10):
        for entries in (llm_entries, csv_entries):
            doc = {
                "v": 2,
                "site": "demo",
                "session": "sess-llm-0001",
                "page": "/",
                "time_origin": origin,
                "entries": entries[batch : batch + 10],
            }
            r = post_beacon(c.ingest, doc)
            assert r.status_code == 200 and r.json()["rejected"] == 0, r.text
    return sent


def _sla_ready(c: Running) -> dict[str, Any] | None:
    doc: dict[str, Any] = httpx.get(f"{c.query}/v1/sla", timeout=10).json()
    routes = {r["route"]: r for r in doc["routes"]}
    for route in (LLM_ROUTE, CSV_ROUTE):
        m = routes.get(route, {}).get("metrics", {}).get("ttft")
        if not m or m["n"] < N:
            return None
    return routes


def _ui(c: Running) -> dict[str, str]:
    """The SLA page as Chromium draws it: both routes' server blocks, opened."""
    from demo.browser import chromium

    out = {}
    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1400, "height": 1400})
        page.goto(f"{c.query}/ui", timeout=15000)
        page.wait_for_selector("body[data-loaded='1']", timeout=15000)
        for route in (LLM_ROUTE, CSV_ROUTE):
            d = page.locator(f"details.route[data-route='{route}']")
            d.locator("summary").click()
            out[route] = d.locator(".server").inner_text()
    return out


_STORED = """
import json, sys
from collector.store.client import Store
c = Store('chdb://' + sys.argv[1]).client()
llm, csv = json.loads(sys.argv[2]), json.loads(sys.argv[3])
def rows(sql, ids):
    q = c.query(sql.format(ids=','.join(f"'{t}'" for t in ids)))
    return [dict(zip(q.column_names, [list(v) if isinstance(v, tuple) else v for v in r]))
            for r in q.result_rows]
S = ('SELECT llm_dialect, gen_ai_operation_name, gen_ai_provider_name, gen_ai_response_model, '
     'gen_ai_response_finish_reasons, gen_ai_usage_input_tokens, gen_ai_usage_output_tokens, '
     'gen_ai_request_stream, gen_ai_response_time_to_first_chunk, error_type, '
     'llm_output_tokens_source, llm_token_offsets_us, llm_gaps, llm_gap_p95_us, llm_gaps_exact, '
     'llm_stall_tokens, llm_queue_us, llm_prefill_us, llm_engine_prefill_us, llm_end, '
     'llm_wasted_tokens FROM parallax.server_spans WHERE trace_id IN ({ids})')
E = ('SELECT trace_id, llm_dialect, llm_first_token_ms, llm_first_output_ms, llm_token_ms, '
     'llm_gap_hist, llm_tokens, llm_tokens_source, llm_end, llm_bad_events '
     'FROM parallax.browser_entries WHERE trace_id IN ({ids})')
P = ('SELECT llm_dialect, llm_model, llm_end, user_llm_end, user_first_token_ms, '
     'server_first_token_ms, user_token_gap_p95_ms, server_token_gap_p95_ms, user_tokens, '
     'server_tokens, llm_queue_ms, llm_prefill_ms, llm_decode_ms, user_ttft_ms, server_ttft_ms '
     'FROM parallax.pairs FINAL WHERE trace_id IN ({ids})')
print(json.dumps({k: {side: rows(sql, ids) for side, ids in (('llm', llm[:3]), ('csv', csv[:1]))}
                  for k, sql in (('spans', S), ('entries', E), ('pairs', P))}, default=str))
"""


@dataclass
class Run:
    c: Running
    sent: Sent
    routes: dict[str, Any]
    metrics: str
    requests: dict[str, dict[str, Any]]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Run]:
    data = tmp_path_factory.mktemp("llm") / "data"
    data.mkdir()
    (data / "sla.yaml").write_text(SLA_YAML)
    c = start_collector(data, "--pairing-lookback", "3600")
    try:
        c.wait_ready(60)
        sent = _send(c)
        routes = wait_for(lambda: _sla_ready(c), timeout_s=90, every_s=1.0)
        metrics = httpx.get(f"{c.query}/metrics", timeout=10).text
        requests = {
            tid: httpx.get(f"{c.query}/v1/requests/{tid}", timeout=10).json()
            for tid, _ in (sent.llm[0], sent.llm[1], sent.csv[0])
        }
        yield Run(c, sent, routes, metrics, requests)
    finally:
        c.stop()


def test_the_query_api_shows_each_sides_stream(run: Run) -> None:
    queued = run.requests[run.sent.llm[0][0]]["exchanges"][0]
    hop = queued["hops"][0]["llm"]
    assert hop["dialect"] == "openai.chat" and hop["provider"] == "llama.cpp"
    assert hop["model"] == "tiny-random" and hop["finish_reasons"] == ["stop"]
    assert (hop["queue_ms"], hop["prefill_ms"]) == (1300.0, 95.0)
    assert hop["first_token_ms"] == 1395.0 and hop["output_tokens"] == TOKENS
    assert hop["gap_p95_ms"] == 11.0 and hop["end"] == "complete" and hop["stalls"] == []
    assert hop["wasted_tokens"] is None and hop["error_type"] is None  # absent, not 0
    browser = queued["browser"]["llm"]
    assert browser["tokens"] == TOKENS and len(browser["token_ms"]) == TOKENS
    assert browser["gap_hist"] == GAP_HIST and browser["bad_events"] is None
    parts = queued["parts"]["llm"]
    assert parts["user_first_token_ms"] == pytest.approx(NET_MS + 1395.0)
    assert parts["server_first_token_ms"] == 1395.0
    assert parts["server_token_gap_p95_ms"] == 11.0
    assert parts["user_token_gap_p95_ms"] == pytest.approx(BURST_GAP_MS - 0.4)
    assert (parts["queue_ms"], parts["prefill_ms"]) == (1300.0, 95.0)
    assert parts["decode_ms"] == (TOKENS - 1) * GAP_US / 1000
    # the role-only delta came first: the first chunk is not the first token
    assert queued["parts"]["user_ttft_ms"] == pytest.approx(NET_MS + 0.5)
    # the paint follows the first answer token, not the role-only delta before it
    assert queued["parts"]["render_delay_ms"] == pytest.approx(PAINT_MS)
    served = run.requests[run.sent.llm[1][0]]["exchanges"][0]
    assert served["hops"][0]["llm"]["queue_ms"] == 0.0  # measured: served beside the others
    csv = run.requests[run.sent.csv[0][0]]["exchanges"][0]
    assert csv["hops"][0]["llm"] is None and csv["browser"]["llm"] is None
    assert csv["parts"]["llm"] is None


def test_the_sla_compares_tokens_and_names_the_queue(run: Run) -> None:
    r = run.routes[LLM_ROUTE]
    ttft, itl = r["metrics"]["ttft"], r["metrics"]["itl"]
    # the first token, not the role-only delta: the server's P95 is a queued answer's
    assert ttft["server_p95_ms"] == pytest.approx(1395.0, rel=0.002)
    assert ttft["divergence_ms"] == pytest.approx(NET_MS, abs=2.0)  # the grid's cells
    assert ttft["verdict"] == "out_of_band" and ttft["n"] == N
    assert re.match(
        rf"{LLM_ROUTE} \({LLM_SERVICE}\): users receive the first token at P95 141\d ms, the "
        r"app writes it at 139\d ms \(\+(19|20|21) ms",
        ttft["sentence"],
    ), ttft["sentence"]
    assert ttft["sentence"].endswith(
        "; server side: queued P95 1.3 s in the engine, first token P95 95 ms after it left "
        "the queue."
    )
    # the proxy lets tokens through in bursts: each answer's P95 gap, user against server
    assert itl["server_p95_ms"] == pytest.approx(11.0, rel=0.01)
    assert itl["user_p95_ms"] == pytest.approx(54.6, rel=0.01)
    assert itl["verdict"] == "out_of_band" and itl["n"] == N
    assert (
        "users wait P95 55 ms between tokens, the app writes them 11 ms apart" in (itl["sentence"])
    )
    srv = r["server"]
    assert srv["llm"]["n"] == N and srv["llm"]["tokens_p95"] == pytest.approx(TOKENS, rel=0.01)
    assert srv["llm"]["queue_p95_ms"] == pytest.approx(1300.0, rel=0.01)
    assert srv["sentence"].startswith(
        f"{LLM_ROUTE} ({LLM_SERVICE}): answers at P95: queued 1.3 s, first token 95 ms after "
        "it left the queue, 100 tokens, gap P95 11 ms (P50: queued 0.0 ms, first token 95 ms "
        "after it left the queue, 100 tokens, gap P95 11 ms)"
    )


def test_a_csv_download_keeps_its_words(run: Run) -> None:
    r = run.routes[CSV_ROUTE]
    assert r["server"]["llm"] is None
    ttft = r["metrics"]["ttft"]  # first chunk against first body write
    assert ttft["server_p95_ms"] == pytest.approx(3.0, abs=0.1)
    assert ttft["user_p95_ms"] == pytest.approx(3.0 + NET_MS, abs=0.1)
    texts = [r["server"]["sentence"], *(m["sentence"] for m in r["metrics"].values())]
    for words in ("token", "queued", "gap P95", "engine", "answers at", "server side"):
        assert not any(words in t for t in texts), (words, texts)
    assert r["server"]["sentence"].startswith(f"{CSV_ROUTE} ({CSV_SERVICE}): server time per")
    assert "users receive the first chunk at P95 23 ms" in ttft["sentence"]
    assert "between chunks" in r["metrics"]["itl"]["sentence"]


def test_genai_client_histograms_on_metrics(run: Run) -> None:
    lint = prom_tools.promtool("check", "metrics", stdin=run.metrics)
    assert (lint.returncode, lint.stdout + lint.stderr) == (0, ""), lint.stdout + lint.stderr
    fams = {f.name: f for f in text_string_to_metric_families(run.metrics)}
    labels = {
        "gen_ai_operation_name": "chat",
        "gen_ai_provider_name": "openai",
        "server_address": "chat.test",
        "server_port": "80",
        "http_route": LLM_ROUTE,
    }

    def sample(family: str, suffix: str, **extra: str) -> float:
        found = [
            s.value
            for s in fams[family].samples
            if s.name == family + suffix and s.labels == {**labels, **extra}
        ]
        assert len(found) == 1, (family, suffix, fams[family].samples[:3])
        return found[0]

    ttfc = "gen_ai_client_operation_time_to_first_chunk_seconds"
    assert sample(ttfc, "_count") == N  # one per answer; the CSV download gives none
    assert {s.labels.get("http_route") for s in fams[ttfc].samples} == {LLM_ROUTE}
    # the unqueued answers' first token came 115 ms after the request: in the 0.16 s bucket
    assert sample(ttfc, "_bucket", le="0.08") == 0
    assert sample(ttfc, "_bucket", le="0.16") == UNQUEUED
    assert sample(ttfc, "_bucket", le="+Inf") == N
    tpoc = "gen_ai_client_operation_time_per_output_chunk_seconds"
    assert sample(tpoc, "_count") == N * (TOKENS - 1) + sum(GAP_HIST)  # one per gap
    # the bursts' 55 ms gaps (19 an answer) over the 0.04 s bound, the 0.1 ms ones under 0.01
    assert sample(tpoc, "_bucket", le="0.01") == N * (TOKENS - 1 - 19) + sum(GAP_HIST)
    assert sample(tpoc, "_bucket", le="0.04") == sample(tpoc, "_bucket", le="0.01")


def test_the_demo_table_says_an_llm_route_in_tokens(run: Run) -> None:
    """`make demo`'s table over this collector's SLA document: the LLM route's rows and
    server sentence in tokens, the CSV download's in its own words."""
    from demo.__main__ import sla_table

    lines = sla_table({"routes": list(run.routes.values())}).splitlines()
    llm = [ln for ln in lines if ln.startswith(f"{LLM_SERVICE} {LLM_ROUTE}"[:28])]
    assert [ln.split()[2:4] for ln in llm[:2]] == [["ttfb", "100"], ["first", "token"]]
    assert any(ln.split()[2:4] == ["token", "gap"] for ln in llm)
    said = "\n".join(ln for ln in lines if ln.startswith("  •"))
    assert (
        f"• {LLM_ROUTE} ({LLM_SERVICE}): answers at P95: queued 1.3 s, first token 95 ms after "
        "it left the queue, 100 tokens, gap P95 11 ms" in said
    )
    csv = [ln for ln in lines if ln.startswith(f"{CSV_SERVICE} {CSV_ROUTE}")]
    assert [ln.split()[2] for ln in csv] == list(run.routes[CSV_ROUTE]["metrics"])
    assert not any("token" in ln for ln in csv)
    assert not any("token" in ln for ln in lines if CSV_ROUTE in ln and ln.startswith("  •"))


@pytest.mark.browser
def test_the_sla_page_says_an_llm_route_in_tokens(run: Run) -> None:
    ui = _ui(run.c)
    llm = ui[LLM_ROUTE]
    assert "Server time per answer, in tokens" in llm
    assert "Queued in the engine\t0.0 ms\t1.3 s" in llm
    assert "Tokens\t100\t100" in llm
    assert "answers at P95: queued 1.3 s, first token 95 ms after it left the queue" in llm
    csv = ui[CSV_ROUTE]
    assert "Server time per request" in csv and "token" not in csv.lower().replace(
        "(first token)", ""
    )


def test_stored_columns_absent_stays_absent(run: Run) -> None:
    """Last in this module: it stops the collector (the embedded store opens in one process
    at a time) and reads the tables themselves."""
    run.c.stop()
    out = run_store_script(
        _STORED,
        run.c.data_dir / "chdb",
        json.dumps([t for t, _ in run.sent.llm]),
        json.dumps([t for t, _ in run.sent.csv]),
    )
    spans = out["spans"]
    assert len(spans["llm"]) == 3 and len(spans["csv"]) == 1
    s = next(x for x in spans["llm"] if x["llm_queue_us"])
    assert s["llm_dialect"] == "openai.chat" and s["gen_ai_provider_name"] == "llama.cpp"
    assert s["gen_ai_response_finish_reasons"] == ["stop"]
    assert (s["gen_ai_usage_input_tokens"], s["gen_ai_usage_output_tokens"]) == (12, TOKENS)
    assert s["gen_ai_request_stream"] is True and s["llm_gaps_exact"] is True
    assert s["gen_ai_response_time_to_first_chunk"] == pytest.approx(1.395)
    assert len(s["llm_token_offsets_us"]) == TOKENS and s["llm_gap_p95_us"] == GAP_US
    assert (s["llm_queue_us"], s["llm_prefill_us"]) == (QUEUE_US, PREFILL_US)
    # not measured: NULL, '' or [] — never 0
    assert s["llm_engine_prefill_us"] is None and s["llm_wasted_tokens"] is None
    assert s["error_type"] == "" and s["llm_stall_tokens"] == []
    csv = spans["csv"][0]
    assert csv["llm_dialect"] == "" and csv["gen_ai_usage_output_tokens"] is None
    assert csv["gen_ai_request_stream"] is None and csv["llm_token_offsets_us"] == []
    assert csv["llm_queue_us"] is None and csv["llm_gaps_exact"] is None
    entries = out["entries"]
    e = next(x for x in entries["llm"] if x["trace_id"] == run.sent.llm[0][0])
    assert e["llm_dialect"] == "openai.chat" and e["llm_tokens"] == TOKENS
    assert len(e["llm_token_ms"]) == TOKENS and e["llm_gap_hist"] == GAP_HIST
    assert e["llm_end"] == "complete" and e["llm_bad_events"] is None
    assert {x["llm_gap_hist"] == [] for x in entries["llm"]} == {True, False}
    ce = entries["csv"][0]
    assert ce["llm_dialect"] == "" and ce["llm_first_token_ms"] is None
    assert ce["llm_token_ms"] == [] and ce["llm_tokens"] is None and ce["llm_end"] == ""
    pairs = out["pairs"]
    p = next(x for x in pairs["llm"] if x["llm_queue_ms"])
    assert p["llm_dialect"] == "openai.chat" and p["llm_model"] == "tiny-random"
    assert p["server_first_token_ms"] == 1395.0 and p["server_tokens"] == TOKENS
    assert p["user_first_token_ms"] == pytest.approx(1415.0)
    cp = pairs["csv"][0]
    assert cp["llm_dialect"] == "" and cp["user_first_token_ms"] is None
    assert cp["server_first_token_ms"] is None and cp["llm_queue_ms"] is None
    assert cp["user_ttft_ms"] == pytest.approx(3.0 + NET_MS)  # its first chunk, as before
    assert Path(run.c.data_dir).exists()
