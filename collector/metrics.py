"""The collector's Prometheus metrics (served on the query port at /metrics), the GenAI
client histograms of the browser beacons among them (``GenAiClient``)."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator, Sequence
from typing import Any
from urllib.parse import urlsplit

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.metrics_core import HistogramMetricFamily, Metric

from collector.pipeline import Hooks
from collector.store import schema

_P = "parallax_collector_"


class Metrics(Hooks):
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self._add_rows(r)
        self._add_store_writes(r)
        self._add_spool(r)
        self._add_ingest_connections(r)
        self._add_pairing(r)
        self.genai_client = GenAiClient(r)  # the browsers' LLM streams (below)

    def _add_rows(self, r: CollectorRegistry) -> None:
        """What came in: rows received, written, rejected or ignored, and whole requests
        refused."""
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

    def _add_store_writes(self, r: CollectorRegistry) -> None:
        """The inserts into the store: their size, latency, failures, and the rows it
        refused for good."""
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

    def _add_spool(self, r: CollectorRegistry) -> None:
        """What waits in the on-disk spool for the store, and the spool's own failures."""
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

    def _add_ingest_connections(self, r: CollectorRegistry) -> None:
        """The ingest port's connections: open, waiting, and the limit."""
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

    def _add_pairing(self, r: CollectorRegistry) -> None:
        """Pairing: its rounds, the pairs written, and the coverage of each route."""
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


# --- OpenTelemetry GenAI semconv's client histograms, from the beacons' llm objects -------
# Seconds, semconv's advised buckets for both (gen_ai.client.operation.time_to_first_chunk and
# time_per_output_chunk); one observation per answer and per gap between its output tokens.
GEN_AI_CLIENT_BUCKETS = (
    0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92,
)  # fmt: skip
GEN_AI_TTFC = "gen_ai_client_operation_time_to_first_chunk_seconds"
GEN_AI_TPOC = "gen_ai_client_operation_time_per_output_chunk_seconds"
_DOCS = {
    GEN_AI_TTFC: "Time from the browser's request to its first answer token (beacon llm "
    "first_token_ms − request start): OpenTelemetry GenAI gen_ai.client.operation."
    "time_to_first_chunk",
    GEN_AI_TPOC: "Time between consecutive output tokens as the browser received them, one "
    "observation per gap: gen_ai.client.operation.time_per_output_chunk",
}
# semconv's attributes as labels (dots as underscores); the beacon names no model, so
# gen_ai.response.model is not among them; http_route is Parallax's (the page's request)
GEN_AI_CLIENT_LABELS = (
    "gen_ai_operation_name",
    "gen_ai_provider_name",
    "server_address",
    "server_port",
    "http_route",
)
# The probe's dialects (parallax_contracts.beacon.Llm) → (gen_ai.operation.name,
# gen_ai.provider.name), as the agent's dialect table names them.
GEN_AI_DIALECTS = {
    "openai.chat": ("chat", "openai"),
    "openai.responses": ("chat", "openai"),
    "anthropic.messages": ("chat", "anthropic"),
    "ollama": ("chat", "ollama"),
}
_EN = {n: i for i, n in enumerate(schema.column_names(schema.ENTRY_COLUMNS))}


class _Hist:
    __slots__ = ("counts", "sum")

    def __init__(self) -> None:
        self.counts = [0] * (len(GEN_AI_CLIENT_BUCKETS) + 1)  # the last: +Inf
        self.sum = 0.0

    def add(self, seconds: float, n: int = 1) -> None:
        i = next((k for k, b in enumerate(GEN_AI_CLIENT_BUCKETS) if seconds <= b), -1)
        self.counts[i] += n
        self.sum += seconds * n


class GenAiClient:
    """The two histograms, fed by the browser_entries rows of accepted beacons (each entry
    once: a client's retry is dropped before). A custom collector: the gaps past a long
    answer's 1024th token come as bucket counts, added at once. Label sets are bounded: past
    MAX_SERIES, a new page's server and route are counted as ``other``."""

    MAX_SERIES = 1000

    def __init__(self, registry: CollectorRegistry) -> None:
        self._lock = threading.Lock()
        self._h: dict[str, dict[tuple[str, ...], _Hist]] = {GEN_AI_TTFC: {}, GEN_AI_TPOC: {}}
        self._seen: set[tuple[str, ...]] = set()
        registry.register(self)

    def _labels(self, row: Sequence[Any]) -> tuple[str, ...]:
        op, provider = GEN_AI_DIALECTS.get(row[_EN["llm_dialect"]], ("chat", "unknown"))
        try:
            u = urlsplit(row[_EN["url"]])
            host, port = u.hostname or "", u.port or {"http": 80, "https": 443}.get(u.scheme)
        except ValueError:  # a port out of range
            host, port = "", None
        labels = (op, provider, host, str(port) if host and port else "", row[_EN["route"]])
        if labels not in self._seen:
            if len(self._seen) >= self.MAX_SERIES:
                return (op, provider, "other", "", "other")
            self._seen.add(labels)
        return labels

    def observe_rows(self, rows: Sequence[Sequence[Any]]) -> None:
        with self._lock:
            for row in rows:
                if row[_EN["llm_dialect"]]:
                    self._observe(row)

    def _observe(self, row: Sequence[Any]) -> None:
        labels = self._labels(row)
        first, t0 = row[_EN["llm_first_token_ms"]], row[_EN["request_start_ms"]]
        if t0 is None:
            t0 = row[_EN["start_ms"]]
        if first is not None:
            self._h[GEN_AI_TTFC].setdefault(labels, _Hist()).add((first - t0) / 1000.0)
        gaps = self._h[GEN_AI_TPOC]
        for a, b in itertools.pairwise(row[_EN["llm_token_ms"]]):
            gaps.setdefault(labels, _Hist()).add((b - a) / 1000.0)
        for i, n in enumerate(row[_EN["llm_gap_hist"]]):
            if n > 0:  # the agent's bucket i = ⌊2·log2(gap µs)⌋, at its geometric middle
                gaps.setdefault(labels, _Hist()).add(round(2 ** ((i + 0.5) / 2)) / 1e6, n)

    def collect(self) -> Iterator[Metric]:
        bounds = [*map(str, GEN_AI_CLIENT_BUCKETS), "+Inf"]
        with self._lock:
            for name, series in self._h.items():
                fam = HistogramMetricFamily(name, _DOCS[name], labels=GEN_AI_CLIENT_LABELS)
                for labels, h in sorted(series.items()):
                    cum = list(itertools.accumulate(h.counts))
                    fam.add_metric(list(labels), list(zip(bounds, cum, strict=True)), h.sum)
                yield fam
