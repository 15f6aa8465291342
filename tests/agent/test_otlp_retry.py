"""The agent's OTLP export through a collector outage (issue 17): a real OpenTelemetry SDK
exporter posting to a real HTTP receiver on loopback that answers 503 (with Retry-After)
and then 200, refuses for good, or is not there at all. No eBPF: the exporter takes the
agent's records directly."""

from __future__ import annotations

import gzip
import itertools
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from agent.export.spans import OtlpExporter
from collector.config import Settings
from demo.stack import free_port
from parallax_contracts import trace_context


class Receiver:
    """An OTLP/HTTP endpoint on 127.0.0.1 answering ``answers`` in order (status,
    Retry-After or None), then 200; it keeps each body with the status it got. A body over
    ``body_limit`` gets a 413, as the collector answers it."""

    def __init__(
        self, answers: list[tuple[int, str | None]], port: int = 0, body_limit: int = 0
    ) -> None:
        self.answers = list(answers)
        self.posts: list[tuple[float, int, bytes]] = []
        me = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if body_limit and len(body) > body_limit:
                    status, retry_after = 413, None
                else:
                    status, retry_after = me.answers.pop(0) if me.answers else (200, None)
                me.posts.append((time.monotonic(), status, body))
                self.send_response(status)
                if retry_after is not None:
                    self.send_header("Retry-After", retry_after)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._srv = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        threading.Thread(target=self._srv.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self._srv.server_address[1]}"

    def taken(self) -> list[str]:
        """Span ids of the bodies answered 200, repeats included."""
        out = []
        for _, status, body in self.posts:
            if status == 200:
                req = ExportTraceServiceRequest.FromString(body)
                out += [sp.span_id.hex() for rs in req.resource_spans
                        for ss in rs.scope_spans for sp in ss.spans]  # fmt: skip
        return out

    def close(self) -> None:
        self._srv.shutdown()
        self._srv.server_close()


def record(i: int) -> dict[str, Any]:
    ctx = trace_context.generate()
    now = time.time_ns()
    return {
        "trace_id": ctx.trace_id,
        "span_id": f"{i + 1:016x}",
        "parent_span_id": ctx.span_id,
        "trace_flags": 1,
        "method": "GET",
        "path": f"/items/{i}",
        "status": 200,
        "pid": 4242,
        "service": "retry-test",
        "comm": "python3",
        "start_unix_ns": now - 2_000_000,
        "end_unix_ns": now,
        "ttfb_us": 900,
        "duration_us": 2000,
        "sample_th": "0",  # every record carries its sampling threshold (agent.records)
    }


def wait_until(pred: Any, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


def test_503_with_retry_after_then_200_delivers_every_span_once() -> None:
    rx = Receiver([(503, "1"), (503, "1"), (503, "1")])
    exp = OtlpExporter(rx.url, batch=100)
    try:
        exp.export_batch([record(i) for i in range(100)])
        wait_until(lambda: exp.delivered == 100, timeout_s=20)
        taken = rx.taken()
        assert sorted(taken) == sorted(f"{i + 1:016x}" for i in range(100))
        assert exp.failed == 0
        times = [t for t, _, _ in rx.posts]
        gaps = [b - a for a, b in itertools.pairwise(times)]
        assert len(gaps) == 3 and min(gaps) > 0.9, gaps  # each Retry-After honoured
    finally:
        exp.close()
        rx.close()


def test_unreachable_collector_then_back() -> None:
    port = free_port()
    # A timeout well above an answer's time: a post that times out is sent again (at least
    # once), and under load (make test-py's two workers) a 1 s timeout once did, twice.
    exp = OtlpExporter(f"http://127.0.0.1:{port}", batch=50, max_backoff_s=0.5, timeout_s=5)
    rx = None
    try:
        exp.export_batch([record(i) for i in range(50)])
        time.sleep(2.0)  # connection refused, retried with backoff; nothing lost
        assert exp.delivered == 0 and exp.failed == 0
        rx = Receiver([], port=port)
        wait_until(lambda: exp.delivered == 50, timeout_s=10)
        assert len(rx.taken()) == 50 and exp.failed == 0
    finally:
        exp.close()
        if rx is not None:
            rx.close()


def test_the_queue_is_bounded_and_keeps_the_newest() -> None:
    """An outage longer than the queue: the batch in flight and the newest ``max_queue``
    spans are delivered when the collector is back; the rest are dropped and counted."""
    rx = Receiver([(503, "1")] * 3)
    exp = OtlpExporter(rx.url, max_queue=50, batch=10, period_s=0.05)
    try:
        exp.export_batch([record(0)])
        wait_until(lambda: len(rx.posts) == 1, timeout_s=5)  # record 0's batch in flight
        exp.export_batch([record(i) for i in range(1, 200)])
        assert exp.dropped == 199 - 50 and exp.failed == exp.dropped
        wait_until(lambda: exp.delivered == 51, timeout_s=20)
        want = {f"{i + 1:016x}" for i in [0, *range(150, 200)]}
        assert set(rx.taken()) == want and len(rx.taken()) == 51
    finally:
        exp.close()
        rx.close()


def test_long_answers_after_an_outage_fit_the_collectors_body_limit() -> None:
    """After an outage the queue holds long LLM answers' spans, each with its 1,024 token
    times (~7 KB): a batch of them in one request would be megabytes, which the collector
    refuses for good (413 over its 1 MiB default). Each request stays under the exporter's
    ``max_bytes``, and every span is delivered."""
    limit = Settings().max_otlp_bytes
    rx = Receiver([(503, "1")], body_limit=limit)
    exp = OtlpExporter(rx.url)  # the agent's defaults
    try:
        exp.export_batch([record(0)])
        wait_until(lambda: len(rx.posts) == 1, timeout_s=5)  # the outage's first refusal
        long = [i * 9_973 for i in range(1024)]
        exp.export_batch([{**record(i), "llm_token_offsets_us": long} for i in range(1, 600)])
        wait_until(lambda: exp.delivered + exp.failed == 600, timeout_s=20)
        sizes = [len(body) for _, status, body in rx.posts if status == 200]
        assert exp.failed == 0 and len(set(rx.taken())) == 600, [s for _, s, _ in rx.posts]
        assert len(sizes) >= 7 and max(sizes) <= limit // 2 + 4096, sizes
    finally:
        exp.close()
        rx.close()


def test_refused_for_good_is_counted_not_retried() -> None:
    rx = Receiver([(400, None)] * 2)
    exp = OtlpExporter(rx.url, batch=10)
    try:
        exp.export_batch([record(i) for i in range(20)])
        wait_until(lambda: exp.refused == 20, timeout_s=10)
        time.sleep(0.5)
        assert len(rx.posts) == 2 and exp.failed == 20 and exp.delivered == 0
    finally:
        exp.close()
        rx.close()


def test_stopping_during_an_outage_counts_what_is_left() -> None:
    rx = Receiver([(503, "30")] * 100)
    exp = OtlpExporter(rx.url, batch=10)
    try:
        exp.export_batch([record(i) for i in range(25)])
        wait_until(lambda: len(rx.posts) >= 1, timeout_s=5)
        t0 = time.monotonic()
        exp.close()
        assert time.monotonic() - t0 < 5  # the 30 s Retry-After wait is cut short
        assert exp.abandoned == 25 and exp.failed == 25 and exp.delivered == 0
    finally:
        rx.close()


def test_the_sdk_batch_processor_alone_drops_a_batch_on_a_503() -> None:
    """Why the agent keeps its own queue: the SDK's BatchSpanProcessor hands a batch to the
    exporter once; with the collector's Retry-After (5 s) equal to the export timeout, the
    exporter gives up at the first 503 and the batch is gone."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExportResult

    rx = Receiver([(503, "5")])
    sdk = OTLPSpanExporter(endpoint=rx.url + "/v1/traces", timeout=5)
    results: list[Any] = []

    class Spy:
        def export(self, spans: Any) -> Any:
            results.append(sdk.export(spans))
            return results[-1]

        def shutdown(self) -> None:
            sdk.shutdown()  # type: ignore[no-untyped-call]

        def force_flush(self, timeout_millis: int = 30000) -> bool:
            return True

    proc = BatchSpanProcessor(Spy(), schedule_delay_millis=50)  # type: ignore[arg-type]
    try:
        proc.on_end(_sdk_span(record(0)))
        proc.force_flush(10_000)
        assert results == [SpanExportResult.FAILURE] and len(rx.posts) == 1
        time.sleep(1.0)
        assert len(rx.posts) == 1 and not rx.taken()  # never sent again
    finally:
        proc.shutdown()  # type: ignore[no-untyped-call]
        rx.close()


def _sdk_span(rec: dict[str, Any]) -> Any:
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.trace import SpanContext, SpanKind, TraceFlags

    ctx = SpanContext(int(rec["trace_id"], 16), int(rec["span_id"], 16), False, TraceFlags(1))
    return ReadableSpan(name="GET /x", context=ctx, kind=SpanKind.SERVER,
                        start_time=rec["start_unix_ns"], end_time=rec["end_unix_ns"])  # fmt: skip


def test_a_record_that_cannot_be_encoded_costs_only_itself(caplog: Any) -> None:
    """A record whose trace id is not hex (nothing here makes one: a bug's shape) is
    counted as failed, once in the log without its values, and its batch's other records
    are delivered."""
    rx = Receiver([])
    exp = OtlpExporter(rx.url, batch=10)
    try:
        bad = {**record(5), "trace_id": "not-hex/secret-path"}
        exp.export_batch([record(i) for i in range(5)] + [bad] + [record(i) for i in range(6, 10)])
        wait_until(lambda: exp.delivered == 9, timeout_s=10)
        assert exp.unencodable == 1 and exp.failed == 1 and len(rx.taken()) == 9
        said = [r.getMessage() for r in caplog.records if "could not be encoded" in r.getMessage()]
        assert len(said) == 1 and "secret" not in said[0], said
    finally:
        exp.close()
        rx.close()
