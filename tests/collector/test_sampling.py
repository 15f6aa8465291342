"""The collector side of the agent's sampling, end to end on a real collector: spans from the
real OpenTelemetry SDK carrying the agent's tracestate (ot=th), the agent's request counts as
SDK metrics over /v1/metrics, and browser beacons for every request.

400 requests, each kept by the contract's rule at p = 0.25 (``sampling.keeps`` on its trace
id); the kept ones exported as spans — but for 10, lost on the way; a beacon entry for every
request. Then: the coverage in /metrics counts the dropped ones as not sampled and only the
10 as missing; the query API says which is which per request; and ``sla --once`` weighs
each pair by 4 and states the share traced from the exact counts.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import httpx
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.metrics import CallbackOptions, Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags, TraceState

from parallax_contracts import agent_metrics as gm
from parallax_contracts import sampling
from parallax_contracts.trace_context import new_span_id, new_trace_id
from tests.collector.helpers import Running, beacon, entry, post_beacon, start_collector, wait_for

N, P, LOST, PORT = 400, 0.25, 10, 8080
TH = sampling.th_from_th32(sampling.th32_for(P))
ROUTE, SERVICE = "/api/chat", "shop"


def _send_spans(c: Running, traces: list[tuple[str, str]], origin_ms: float) -> None:
    """SERVER spans as the agent exports them: the browser's span as the remote parent, its
    tracestate ot=th:… carried over by the SDK's parent-based sampler."""
    tp = TracerProvider(resource=Resource.create({"service.name": SERVICE, "host.name": "n1"}))
    tp.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(f"{c.ingest}/v1/traces")))
    tracer = tp.get_tracer("parallax.agent")
    state = TraceState([("ot", sampling.tracestate(TH))])
    for tid, parent in traces:
        ctx = SpanContext(int(tid, 16), int(parent, 16), True, TraceFlags(1), state)
        start = int((origin_ms + 105) * 1e6)
        span = tracer.start_span(
            "GET /api/chat",
            context=trace.set_span_in_context(NonRecordingSpan(ctx)),
            kind=SpanKind.SERVER,
            start_time=start,
            attributes={"url.path": ROUTE, "server.port": PORT},
        )
        span.end(end_time=start + 20_000_000)
    assert tp.force_flush(10_000)
    tp.shutdown()


def _send_counts(c: Running, kept: int) -> None:
    """The agent's counts for the port, exported twice (cumulative), and its probability."""
    now: dict[str, float] = {"seen": N / 2, "traced": kept // 2}

    def counter(which: str) -> Any:
        def observe(_o: CallbackOptions) -> Iterable[Observation]:
            yield Observation(now[which], {gm.SERVER_PORT: PORT, gm.SERVICE_NAME: SERVICE})

        return observe

    reader = PeriodicExportingMetricReader(
        OTLPMetricExporter(endpoint=f"{c.ingest}/v1/metrics"), export_interval_millis=3_600_000
    )
    mp = MeterProvider(resource=Resource.create({"host.name": "n1"}), metric_readers=[reader])
    meter = mp.get_meter("parallax.agent")
    meter.create_observable_counter(gm.REQUESTS_SEEN.name, [counter("seen")])
    meter.create_observable_counter(gm.REQUESTS_TRACED.name, [counter("traced")])
    meter.create_observable_gauge(
        gm.SAMPLING_PROBABILITY.name, [lambda _o: [Observation(sampling.probability(TH))]]
    )
    assert mp.force_flush(10_000)
    now.update(seen=N, traced=kept)
    assert mp.force_flush(10_000)
    mp.shutdown()


def _metrics(c: Running) -> dict[str, float]:
    text = httpx.get(f"{c.query}/metrics", timeout=5).text
    out = {}
    for name, labels, v in re.findall(
        r"^(parallax_collector_pairing_\w+)\{(.*)\} (\S+)$", text, re.M
    ):
        if f'route="{ROUTE}"' in labels:
            key = re.search(r'(?:side|state)="(\w+)"', labels)
            assert key is not None
            out[f"{name.rsplit('_', 1)[1]}:{key.group(1)}"] = float(v)
    return out


def test_sampled_spans_counts_and_coverage(tmp_path: Path) -> None:
    data = tmp_path / "data"
    c = start_collector(data, "--coverage-interval", "1", "--rate", "0")
    try:
        c.wait_ready()
        origin_ms = time.time() * 1000 - 60_000  # inside the coverage window (ends 30 s ago)
        traces = [(new_trace_id(), new_span_id()) for _ in range(N)]
        kept = [t for t in traces if sampling.keeps(t[0], TH)]
        dropped = [t for t in traces if not sampling.keeps(t[0], TH)]
        assert 60 < len(kept) < 140  # p = 0.25 of 400
        lost, sent = kept[:LOST], kept[LOST:]
        _send_spans(c, sent, origin_ms)
        _send_counts(c, len(kept))
        for i in range(0, N, 50):
            doc = beacon([entry(t, p) for t, p in traces[i : i + 50]], time_origin=origin_ms)
            assert post_beacon(c.ingest, doc).json()["accepted"] == 50

        want = {
            "coverage:entries": len(sent) / len(kept),  # of the entries the agent kept
            "coverage:spans": 1.0,
            "entries:paired": len(sent),
            "entries:not_sampled": len(dropped),
            "entries:missing": LOST,
        }
        wait_for(lambda: _metrics(c) == want, timeout_s=30)

        def record(tid: str) -> tuple[str, list[float]]:
            r = httpx.get(f"{c.query}/v1/requests/{tid}", timeout=5)
            ex = r.json()["exchanges"][0]
            return ex["server_record"], [h["keep_probability"] for h in ex["hops"]]

        assert record(sent[0][0]) == ("paired", [sampling.probability(TH)])
        assert record(dropped[0][0]) == ("not_sampled", [])
        assert record(lost[0][0]) == ("missing", [])
    finally:
        assert c.stop() == 0
    p = subprocess.run(
        [sys.executable, "-m", "collector.cli", "sla", "--once", "--json", "--data-dir", str(data)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert p.returncode in (0, 1), p.stderr
    route = next(r for r in json.loads(p.stdout)["routes"] if r["route"] == ROUTE)
    s = route["sampling"]
    assert (s["seen"], s["traced"], s["ports"]) == (N, len(kept), [PORT])
    assert s["probability_min"] == s["probability_max"] == sampling.probability(TH)
    assert s["pairs"] == len(sent) and abs(s["pair_requests"] - len(sent) / P) < 0.5
    share = f"{100 * len(kept) / N:.0f} %"
    about = f"{100 * len(sent) / s['pair_requests']:.0f} %"
    assert s["sentence"] == (
        f"{ROUTE} ({SERVICE}): traced about {about} of this route's requests in the last 5 min "
        f"({len(sent)} pairs stand for {s['pair_requests']:,.0f}); its service traced "
        f"{len(kept)} of {N} requests ({share}, counted by the agent on port {PORT}); sampling "
        "now 25 %."
    )
    m = route["metrics"]["ttfb"]
    assert m["n"] == m["n_eff"] == len(sent)  # one probability in the window: equal weights
