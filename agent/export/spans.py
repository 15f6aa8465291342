"""Exporters: JSON lines (a file or stdout) and OTLP/HTTP (protobuf: agent.export.otlp_wire's
encoding, the OpenTelemetry SDK's transport).

Spans are SERVER spans, children of the browser's span named by ``traceparent`` (a fresh
trace where there is none), starting at t1 (the app's read of the request) and ending at
the last response write, with the attributes of parallax_contracts.span_attributes.
"""

from __future__ import annotations

import logging
import random
import socket
import sys
import threading
import time
from collections import deque
from typing import Any, BinaryIO

import orjson
import requests

from agent import records
from agent.diagnostics import where
from agent.export import otlp_wire
from parallax_contracts import span_attributes as sa
from parallax_contracts.routes import route_template

log = logging.getLogger("parallax.agent")


class JsonlExporter:
    """One line per record; written in batches (one write and flush per batch: a write per
    line cost a syscall per request)."""

    def __init__(self, target: str) -> None:
        self._own = target != "-"
        self._f: BinaryIO = open(target, "ab") if self._own else sys.stdout.buffer  # noqa: SIM115

    @property
    def failed(self) -> int:
        return 0  # a failed write raises (the exporter thread logs it)

    def export_batch(self, recs: list[dict[str, Any]]) -> None:
        # orjson: compact, UTF-8, the same objects json.dumps accepts (dicts of str, int,
        # None, bool, lists) at a fifth of its cost; one write per batch
        dumps = orjson.dumps
        self._f.write(b"".join([dumps(r) + b"\n" for r in recs]))
        self._f.flush()

    def close(self) -> None:
        self._f.flush()
        if self._own:
            self._f.close()


_SCOPE = otlp_wire.scope("parallax.agent")  # the instrumentation scope of every span


_ROUTES: dict[str, str] = {}  # path → route: most requests repeat a path seen before


def _route(path: str) -> str:
    r = _ROUTES.get(path)
    if r is None:
        if len(_ROUTES) >= 4096:  # (paths with ids in them: bounded, cleared now and then)
            _ROUTES.clear()
        r = _ROUTES[path] = route_template(path)
    return r


def span_of(rec: dict[str, Any]) -> bytes:
    """The record as an OTLP Span message: a SERVER span, the child of the span its
    traceparent named. The sampled flag is the agent's: it exports only what it kept, at
    the probability its trace state says (OpenTelemetry's ot=th:…; OTLP carries no trace
    flags on a span); whether the browser sampled the trace is the beacon's own field."""
    route = _route(rec["path"])
    fields = otlp_wire.record_attributes
    if fields is not None:  # compiled: from the record's dict, no dict of attributes
        extra = records.rpc_attributes(rec)
        extra[sa.HTTP_ROUTE.name] = route
        attrs = fields(0x4A, rec, records.SPAN_VALUES, records.SPAN_FLAGS)
        attrs += otlp_wire.attributes(b"\x4a", extra)
    else:
        picked = records.span_attributes(rec)
        picked[sa.HTTP_ROUTE.name] = route
        attrs = otlp_wire.attributes(b"\x4a", picked)  # attributes 9
    return otlp_wire.span(
        rec["trace_id"],
        rec["span_id"],
        f"ot=th:{rec.get('sample_th') or '0'}",
        rec["parent_span_id"],
        f"{rec['method']} {route}",
        rec["start_unix_ns"],
        rec["end_unix_ns"],
        attrs,
        (rec.get("status") or 0) >= 500,
    )


# OTLP/HTTP's "try again later" (the SDK retries these too, within one export's timeout).
RETRYABLE = frozenset({429, 502, 503, 504})


class _LastAnswer(requests.Session):
    """The exporter's HTTP session, remembering its last answer (status, Retry-After) or
    error: the SDK reports only success or failure, and what to do next depends on why."""

    def __init__(self) -> None:
        super().__init__()
        self.status: int | None = None
        self.retry_after: float | None = None
        self.error: str | None = None

    def forget(self) -> None:
        self.status = self.retry_after = self.error = None

    def request(self, *args: Any, **kwargs: Any) -> requests.Response:
        try:
            r = super().request(*args, **kwargs)
        except requests.RequestException as e:
            self.status, self.retry_after, self.error = None, None, type(e).__name__
            raise
        self.status, self.error = r.status_code, None
        try:
            self.retry_after = float(r.headers.get("retry-after", ""))
        except ValueError:
            self.retry_after = None
        return r


class OtlpExporter:
    """Spans in a bounded queue, encoded as they come (agent.export.otlp_wire), sent in
    batches by one thread through the OTLP/HTTP exporter of the OpenTelemetry SDK.

    A batch is ``batch`` spans (at most ``max_bytes`` of them) or what came in ``period_s``.
    A POST costs the sender ~1 ms of CPU whatever its size (the SDK's client and
    ``requests``): 512 spans every 0.5 s cost it 22-23 µs a request at 200 requests/s and
    ~4.8 at 1,900; 1,024 every second, 13-15 and ~3.7 (docs/benchmarks.md, "Drains that
    follow the event rate"). The SDK's own BatchSpanProcessor waits 5 s.

    A batch the collector cannot take for now — 429, 502, 503, 504, unreachable, timed out —
    is kept and sent again after a backoff (its Retry-After when it gave one, else 1 s
    doubling to ``max_backoff_s``, ±20 %), so a collector restart or a short outage loses
    nothing. Meanwhile spans queue up to ``max_queue``; beyond it the oldest are dropped
    (the newest matter most once the collector is back), counted, and said once per outage.
    A batch refused for good (another 4xx or 5xx) is dropped and counted. The SDK's own
    BatchSpanProcessor does neither: it drops a batch whose export failed after the
    exporter's own retries (5 s here; with the collector's Retry-After of 5 s, no retry at
    all), and drops queued spans with a log line each (docs/collector.md, "The agent during
    a collector outage")."""

    def __init__(
        self,
        base_url: str,
        max_queue: int = 8192,
        batch: int = 1024,
        period_s: float = 1.0,
        max_backoff_s: float = 30.0,
        max_bytes: int = 512 << 10,
        timeout_s: float = 5.0,
    ) -> None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # noqa: PLC0415
            OTLPSpanExporter,
        )

        # Its per-attempt lines would repeat every backoff; this class says it once.
        logging.getLogger(OTLPSpanExporter.__module__).setLevel(logging.CRITICAL)
        self._answer = _LastAnswer()
        endpoint = base_url.rstrip("/") + "/v1/traces"
        self._sdk = OTLPSpanExporter(endpoint=endpoint, timeout=timeout_s, session=self._answer)
        self.max_queue, self.batch, self.period_s = max_queue, batch, period_s
        self.max_backoff_s = max_backoff_s
        self.max_bytes = max_bytes  # of spans per request (the resources come on top)
        self._queue: deque[tuple[bytes, bytes]] = deque()  # (resource, span), encoded
        self._cv = threading.Condition()
        self._closing = False
        self.delivered = 0  # spans the collector took
        self.dropped = 0  # oldest spans dropped at the full queue
        self.refused = 0  # spans in batches refused for good
        self.unencodable = 0  # records the encoder could not take (the export thread's count)
        self._unencodable: set[str] = set()  # exception types already logged
        self.abandoned = 0  # spans still undelivered when close() gave up
        self._outage: tuple[float, int] | None = None  # (since, dropped then)
        self._drops_said = False
        # (pid, service) → (the record's resource dict it was built from, Resource)
        self._resources: dict[tuple[int, str], tuple[Any, bytes]] = {}
        self._host = socket.gethostname()
        self._thread = threading.Thread(target=self._send_loop, name="otlp-send", daemon=True)
        self._thread.start()

    @property
    def failed(self) -> int:
        """Spans accepted but not delivered: dropped at the full queue, refused by the
        collector, left when the agent stopped during an outage, or records that could not
        be encoded."""
        return self.dropped + self.refused + self.abandoned + self.unencodable

    def _resource(self, pid: int, service: str, comm: str, extra: dict[str, Any] | None) -> bytes:
        """The process's Resource, encoded; ``extra``: the record's ``resource``
        (agent.identity.resource: host, container, pod), one dict per process state, so a
        new one means a rebuild. The SDK's ``Resource.create`` adds its own attributes and
        those of ``OTEL_RESOURCE_ATTRIBUTES``."""
        key = (pid, service)
        hit = self._resources.get(key)
        if hit is None or hit[0] is not extra:
            # (imported here, on a miss: an import statement costs every record that runs it)
            from opentelemetry.sdk.resources import Resource  # noqa: PLC0415

            if len(self._resources) > 4096:
                self._resources.clear()
            r = Resource.create(
                {
                    sa.RESOURCE_HOST_NAME: self._host,
                    **(extra or {}),
                    sa.RESOURCE_SERVICE_NAME: service,
                    sa.RESOURCE_PROCESS_PID: pid,
                    sa.RESOURCE_PROCESS_EXECUTABLE_NAME: comm,
                }
            )
            hit = self._resources[key] = (extra, otlp_wire.resource(r.attributes))
        return hit[1]

    def export(self, rec: dict[str, Any]) -> None:
        """One record (export_batch)."""
        self.export_batch([rec])

    def export_batch(self, recs: list[dict[str, Any]]) -> None:
        """The records as OTLP spans, encoded now (agent.export.otlp_wire), queued under
        one lock; at the full queue the oldest spans go."""
        encoded = []
        for rec in recs:
            try:
                encoded.append(
                    (
                        self._resource(
                            rec["pid"], rec["service"], rec["comm"], rec.get("resource")
                        ),
                        span_of(rec),
                    )
                )
            except (ValueError, TypeError, KeyError) as e:
                self._unencodable_record(e)
        if not encoded:
            return
        with self._cv:
            if self._closing:
                self.abandoned += len(encoded)
                return
            q = self._queue
            q.extend(encoded)
            if len(q) > self.max_queue:
                for _ in range(len(q) - self.max_queue):
                    q.popleft()
                    self.dropped += 1
                if not self._drops_said:  # once until spans are delivered again
                    self._drops_said = True
                    log.warning(
                        "otlp: queue full (%d spans): dropping the oldest, counted in "
                        "parallax_agent_otlp_failed_spans_total",
                        self.max_queue,
                    )
            if len(q) >= self.batch:
                self._cv.notify()

    def _unencodable_record(self, e: Exception) -> None:
        """A record the encoder cannot take (a bug, or a field of a type nothing here
        anticipated) must not take the rest of its batch with it: counted (in ``failed``),
        said once per type, never its values (they may quote a path)."""
        self.unencodable += 1
        if type(e).__name__ not in self._unencodable:
            self._unencodable.add(type(e).__name__)
            log.warning(
                "otlp: a record could not be encoded (%s at %s): counted in"
                " parallax_agent_otlp_failed_spans_total (said once per type)",
                type(e).__name__,
                where(e),
            )

    # -- the sender thread ----------------------------------------------------------------
    def _next_batch(self) -> list[tuple[bytes, bytes]]:
        with self._cv:
            if len(self._queue) < self.batch and not self._closing:
                self._cv.wait(self.period_s)  # a full batch, or what came in a period
            q, size = self._queue, 0
            out: list[tuple[bytes, bytes]] = []
            # at most `batch` spans and about `max_bytes` (never none): a collector refuses
            # a larger body for good (413; this collector's default limit is 1 MiB), and
            # 512 spans of long LLM answers, their token times in them, are megabytes
            while q and len(out) < self.batch:
                size += len(q[0][1])
                if out and size > self.max_bytes:
                    break
                out.append(q.popleft())
            return out

    def _send_loop(self) -> None:
        pending: list[tuple[bytes, bytes]] = []
        failures = 0
        while True:
            if not pending:
                pending = self._next_batch()
                if not pending:
                    if self._closing:
                        return
                    continue
            retry_in = self._send(pending, failures)
            if retry_in is None:
                pending, failures = [], 0
                continue
            failures += 1
            with self._cv:
                if not self._closing:
                    self._cv.wait(retry_in)  # close() cuts the wait short
                if self._closing:
                    # Stopping during an outage: what is left cannot be delivered.
                    self.abandoned += len(pending) + len(self._queue)
                    self._queue.clear()
                    log.warning(
                        "otlp: stopping while the collector is unavailable: %d spans undelivered",
                        self.abandoned,
                    )
                    return

    def _send(self, spans: list[tuple[bytes, bytes]], failures: int) -> float | None:
        """Deliver ``spans``: None when done with them (taken, or refused for good and
        counted), else the seconds to wait before trying them again."""
        self._answer.forget()
        body = otlp_wire.request(spans, _SCOPE)
        # the SDK's transport (OTEL_EXPORTER_OTLP_* headers, TLS, compression, its retries
        # within the timeout); its encoder is what otlp_wire replaces
        if self._sdk._client.export(body).success:
            self.delivered += len(spans)
            self._drops_said = False
            if self._outage is not None:
                since, dropped = self._outage
                log.warning(
                    "otlp: the collector takes spans again after %.0f s; %d dropped meanwhile",
                    time.monotonic() - since,
                    self.dropped - dropped,
                )
                self._outage = None
            return None
        status = self._answer.status
        never_sent = status is None and self._answer.error is None  # (no answer, no error)
        if never_sent or (status is not None and status not in RETRYABLE):
            self.refused += len(spans)
            log.warning(
                "otlp: the collector refused %d spans for good (HTTP %s)", len(spans), status
            )
            return None
        if self._outage is None:
            self._outage = (time.monotonic(), self.dropped)
            why = f"HTTP {status}" if status is not None else self._answer.error
            log.warning(
                "otlp: the collector is unavailable (%s): holding spans (at most %d), retrying",
                why,
                self.max_queue,
            )
        if self._answer.retry_after is not None:
            return min(self._answer.retry_after, self.max_backoff_s)
        return min(self.max_backoff_s, 2.0**failures) * random.uniform(0.8, 1.2)  # noqa: S311

    def close(self) -> None:
        """Deliver what is queued (bounded: one export timeout past the current wait), then
        release the exporter."""
        with self._cv:
            self._closing = True
            self._cv.notify_all()
        self._thread.join(timeout=30)
        self._sdk.shutdown()  # type: ignore[no-untyped-call]
