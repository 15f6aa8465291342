"""The collector's Prometheus metrics (served on the query port at /metrics)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from collector.pipeline import Hooks

_P = "parallax_collector_"


class Metrics(Hooks):
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.received = Counter(
            _P + "rows_received", "Records received, before validation", ["source"], registry=r
        )
        self.written_rows = Counter(
            _P + "rows_written", "Rows written to the store", ["source"], registry=r
        )
        self.rejected = Counter(
            _P + "rows_rejected", "Records rejected, by reason", ["source", "reason"], registry=r
        )
        self.ignored = Counter(
            _P + "spans_ignored", "Well-formed spans not stored (not SpanKind SERVER)", registry=r
        )
        self.points_ignored = Counter(
            _P + "metric_points_ignored",
            "Well-formed OTLP metric points not stored, by reason (docs/collector.md)",
            ["reason"],
            registry=r,
        )
        self.requests_refused = Counter(
            _P + "requests_refused",
            "Whole requests refused, by endpoint and HTTP status",
            ["endpoint", "code"],
            registry=r,
        )
        self.batch_rows = Histogram(
            _P + "batch_rows",
            "Rows per insert",
            ["source"],
            buckets=(1, 10, 100, 1000, 5000, 10000, 20000, 50000, 100000),
            registry=r,
        )
        self.write_seconds = Histogram(
            _P + "write_seconds",
            "Latency of one insert",
            ["source"],
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=r,
        )
        self.store_errors = Counter(_P + "store_errors", "Failed store writes", registry=r)
        self.quarantined_rows = Counter(
            _P + "rows_quarantined",
            "Rows the store rejected for good (moved to <data-dir>/quarantine)",
            ["source"],
            registry=r,
        )
        self.queue_rows = Gauge(_P + "queue_rows", "Accepted rows not yet written", registry=r)
        self.queue_segments = Gauge(
            _P + "queue_segments", "Spool segments not yet written", registry=r
        )
        self.spool_bytes = Gauge(_P + "spool_bytes", "Bytes in the on-disk spool", registry=r)
        self.spool_disk_full = Gauge(
            _P + "spool_disk_full",
            "1 while the spool's filesystem is full (ingest answers 503 + Retry-After)",
            registry=r,
        )
        self.spool_write_errors = Counter(
            _P + "spool_write_errors",
            "Spool writes that failed or were short, undone and answered 503, by errno",
            ["reason"],
            registry=r,
        )
        self.spool_skipped_bytes = Counter(
            _P + "spool_skipped_bytes",
            "Bytes of torn or damaged records skipped when a segment was replayed",
            registry=r,
        )
        self.ingest_connections = Gauge(
            _P + "ingest_connections",
            "Connections on the ingest port: open (accepted by the server) and waiting "
            "(completed handshakes queued while the server is at its connection limit)",
            ["state"],
            registry=r,
        )
        self.ingest_connection_limit = Gauge(
            _P + "ingest_connection_limit",
            "Connections the ingest server accepts at once (--max-connections, kept below "
            "the file-descriptor limit)",
            registry=r,
        )
        self.pairs_written = Counter(
            _P + "pairs_written", "Pair rows written (new or updated)", registry=r
        )
        self.pairing_seconds = Histogram(
            _P + "pairing_seconds", "Latency of one pairing round", registry=r
        )
        self.coverage = Gauge(
            _P + "pairing_coverage",
            "Share of server spans with a browser entry (side=spans) and of the browser "
            "entries the agent would have traced with a server span (side=entries; entries "
            "its sampling dropped are not misses), per route, over 5 minutes ending 30 s ago",
            ["route", "side"],
            registry=r,
        )
        self.pairing_entries = Gauge(
            _P + "pairing_entries",
            "Browser entries per route over the coverage window by state: paired, "
            "not_sampled (the agent's sampling dropped the trace) or missing (the agent "
            "would have kept it: no server record)",
            ["route", "state"],
            registry=r,
        )

    # Pipeline hooks
    def written(self, source: str, rows: int, seconds: float) -> None:
        self.written_rows.labels(source).inc(rows)
        self.batch_rows.labels(source).observe(rows)
        self.write_seconds.labels(source).observe(seconds)

    def store_error(self, error: BaseException) -> None:
        self.store_errors.inc()

    def quarantined(self, source: str, rows: int) -> None:
        self.quarantined_rows.labels(source).inc(rows)

    def spool_write_failed(self, reason: str) -> None:
        self.spool_write_errors.labels(reason).inc()

    def spool_skipped(self, nbytes: int) -> None:
        self.spool_skipped_bytes.inc(nbytes)
