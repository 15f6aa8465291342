"""Exporters: JSON lines (a file or stdout) and OTLP/HTTP (OpenTelemetry SDK, protobuf).

Spans are SERVER spans, children of the browser's span named by ``traceparent`` (a fresh
trace where there is none), starting at t1 (the app's read of the request) and ending at
the last response write, with the attributes of parallax_contracts.span_attributes.
"""

from __future__ import annotations

import socket
import sys
from typing import Any, BinaryIO

import orjson

from agent import records
from parallax_contracts import span_attributes as sa
from parallax_contracts.routes import route_template


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


class _Counted:
    """The OTLP exporter, counting the spans of the batches it failed to deliver (after its
    own retries): the batch processor only logs them."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.failed = 0  # written by the batch processor's one worker thread only

    def export(self, spans: Any) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult  # noqa: PLC0415

        result = self._inner.export(spans)
        if result != SpanExportResult.SUCCESS:
            self.failed += len(spans)
        return result

    def shutdown(self) -> None:
        self._inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return bool(self._inner.force_flush(timeout_millis))


class OtlpExporter:
    """One BatchSpanProcessor in front of the OTLP/HTTP exporter; resources per process."""

    def __init__(self, base_url: str, max_queue: int = 8192) -> None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # noqa: PLC0415
            OTLPSpanExporter,
        )
        from opentelemetry.sdk.trace.export import BatchSpanProcessor  # noqa: PLC0415

        endpoint = base_url.rstrip("/") + "/v1/traces"
        self._exporter = _Counted(OTLPSpanExporter(endpoint=endpoint, timeout=5))
        self._proc = BatchSpanProcessor(
            self._exporter,  # type: ignore[arg-type]
            max_queue_size=max_queue,  # bounded: the SDK drops (and logs) beyond it
            schedule_delay_millis=500,
        )
        self._resources: dict[tuple[int, str], Any] = {}
        self._host = socket.gethostname()

    def _resource(self, pid: int, service: str, comm: str) -> Any:
        from opentelemetry.sdk.resources import Resource  # noqa: PLC0415

        key = (pid, service)
        r = self._resources.get(key)
        if r is None:
            if len(self._resources) > 4096:
                self._resources.clear()
            r = Resource.create(
                {
                    sa.RESOURCE_SERVICE_NAME: service,
                    sa.RESOURCE_PROCESS_PID: pid,
                    sa.RESOURCE_PROCESS_EXECUTABLE_NAME: comm,
                    sa.RESOURCE_HOST_NAME: self._host,
                }
            )
            self._resources[key] = r
        return r

    def export(self, rec: dict[str, Any]) -> None:
        from opentelemetry.sdk.trace import ReadableSpan  # noqa: PLC0415
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope  # noqa: PLC0415
        from opentelemetry.trace import SpanContext, SpanKind, TraceFlags  # noqa: PLC0415
        from opentelemetry.trace.status import Status, StatusCode  # noqa: PLC0415

        flags = TraceFlags(rec["trace_flags"] | TraceFlags.SAMPLED)
        ctx = SpanContext(int(rec["trace_id"], 16), int(rec["span_id"], 16), False, flags)
        parent = (
            SpanContext(int(rec["trace_id"], 16), int(rec["parent_span_id"], 16), True, flags)
            if rec["parent_span_id"]
            else None
        )
        attrs = records.span_attributes(rec)
        route = route_template(rec["path"])
        attrs[sa.HTTP_ROUTE.name] = route
        status = rec.get("status") or 0
        span = ReadableSpan(
            name=f"{rec['method']} {route}",
            context=ctx,
            parent=parent,
            resource=self._resource(rec["pid"], rec["service"], rec["comm"]),
            attributes=attrs,
            kind=SpanKind.SERVER,
            start_time=rec["start_unix_ns"],
            end_time=rec["end_unix_ns"],
            status=Status(StatusCode.ERROR) if status >= 500 else Status(StatusCode.UNSET),
            instrumentation_scope=InstrumentationScope("parallax.agent"),
        )
        self._proc.on_end(span)

    def export_batch(self, recs: list[dict[str, Any]]) -> None:
        for rec in recs:
            self.export(rec)

    @property
    def failed(self) -> int:
        """Spans in batches the collector did not take (after the exporter's retries)."""
        return self._exporter.failed

    def close(self) -> None:
        self._proc.force_flush(5000)
        self._proc.shutdown()  # type: ignore[no-untyped-call]
