"""The store's schema: every table's DDL and its versioned migrations, in this one module.

Tables (database ``parallax`` unless the DSN names one):

- ``server_spans``    one row per server span (agent or any OTLP source); kernel timings as
                      the wire gives them: integer µs (``*_us``), instants DateTime64(9) UTC.
- ``browser_entries`` one row per beacon entry; times as the beacon gives them: float ms
                      relative to ``time_origin_ms`` (Unix ms), plus the absolute ``time``.
- ``pairs``           one row per browser entry matched with its server hop(s), filled by the
                      collector as the second side arrives. **All durations Float64 ms**
                      (``*_ms``), NULL where not measured; arrays empty where not measured.
                      ReplacingMergeTree(version): read it with ``FINAL`` (or the ``pairs_final``
                      view) — a pair is rewritten when a late hop or span changes it.
- ``gpu_samples``     one row per OTLP metric point of the GPU device and per-process series
                      (``parallax_contracts.agent_metrics``): time, host, GPU (``hw_id``), pid,
                      metric name, value (migration 3).
- ``request_counts``  one row per OTLP metric point of the agent's request counts and
                      sampling probability (``parallax.requests.seen`` / ``traced`` per port,
                      ``parallax.sampling.probability``; migration 4).
- ``schema_migrations`` the applied migration versions.

The LLM stream columns of spans, entries and pairs (migration 6) are declared in
``collector/store/llm_columns.py``.

``migrate()`` runs at start: it applies the missing versions in order. Every statement is
idempotent (``IF NOT EXISTS``), so a crash between a statement and its version row, or two
collectors starting at once, is harmless. docs/store.md explains the choices and documents
every column of ``pairs``.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from collector.store.column import Column as Column  # noqa: PLC0414  (re-exported)
from collector.store.column import col as _c
from collector.store.layout import Layout
from collector.store.llm_columns import ENTRY_LLM_COLUMNS as ENTRY_LLM_COLUMNS  # noqa: PLC0414
from collector.store.llm_columns import PAIR_LLM_COLUMNS as PAIR_LLM_COLUMNS  # noqa: PLC0414
from collector.store.llm_columns import SPAN_LLM_COLUMNS as SPAN_LLM_COLUMNS  # noqa: PLC0414
from collector.store.upkeep import Executor, align_ttl, scalar_rows, tune_merges

DEFAULT_DATABASE = "parallax"
DEFAULT_RETENTION_DAYS = 7
# Oldest ClickHouse server the DDL and the insert settings are written for (by feature
# history: insert_deduplication_token 22.2, Bool 21.12, Map 21.8 GA); first LTS after them.
OLDEST_SERVER_VERSION = "22.3"
# Blocks remembered per table for insert-token deduplication (spool replay after a crash
# re-inserts at most the few segments that were in flight).
DEDUP_WINDOW = 1000

SPANS = "server_spans"
ENTRIES = "browser_entries"
PAIRS = "pairs"
MIGRATIONS = "schema_migrations"
# Sorted by trace id (materialized views of the two tables above): "does this trace have a
# span / an entry?" is a primary-key lookup, not a scan of bloom-filtered granules.
SPAN_TRACES = "span_traces"
ENTRY_TRACES = "entry_traces"
GPU_SAMPLES = "gpu_samples"
REQUEST_COUNTS = "request_counts"


# Time columns: Delta before ZSTD (monotone-ish within a part); small ints: T64.
_TIME9 = "Delta, ZSTD(1)"
_INT = "T64, ZSTD(1)"
_FLOAT = "Gorilla, ZSTD(1)"

# server_spans as migration 1 created it: shipped, never edited (later columns are ALTERs).
_SPAN_COLUMNS_V1: tuple[Column, ...] = (
    _c("time", "DateTime64(9, 'UTC')", _TIME9),  # span start (= t1 for the agent)
    _c("end_time", "DateTime64(9, 'UTC')", _TIME9),
    _c("received", "DateTime64(3, 'UTC')", _TIME9),  # when the collector accepted it
    _c("trace_id", "String"),  # 32 lowercase hex
    _c("span_id", "String"),  # 16 lowercase hex
    _c("parent_span_id", "String"),  # '' for a root span
    _c("span_name", "LowCardinality(String)"),
    _c("source", "LowCardinality(String)"),  # 'ebpf' (agent) or 'sdk'
    _c("service", "LowCardinality(String)"),
    _c("host", "LowCardinality(String)"),  # node (host.name)
    _c("pid", "UInt32", _INT),
    _c("method", "LowCardinality(String)"),
    _c("route", "LowCardinality(String)"),
    _c("path", "String"),
    _c("status", "UInt16", _INT),  # 0 = unknown
    _c("server_address", "LowCardinality(String)"),
    _c("server_port", "UInt16", _INT),  # 0 = unknown
    _c("client_address", "String"),
    _c("client_port", "UInt16", _INT),
    _c("arrival", "Nullable(DateTime64(9, 'UTC'))"),  # t_arr
    _c("ttfb_us", "Nullable(Int64)"),  # t2 − t1
    _c("recv_queue_us", "Nullable(Int64)"),  # t1 − max(t_arr, t_acc)
    _c("accept_queue_us", "Nullable(Int64)"),  # t_acc − t_est (first request only)
    _c("ttft_us", "Nullable(Int64)"),  # t_tok − t1
    _c("duration_us", "Int64", _INT),  # parallax.duration_us, else end − start
    _c("chunk_offsets_us", "Array(Int64)"),  # body writes − t1 (first 256)
    _c("chunks", "Nullable(UInt32)"),
    _c("chunk_gap_max_us", "Nullable(Int64)"),
    _c("bytes_in", "Nullable(UInt64)"),
    _c("bytes_out", "Nullable(UInt64)"),
    _c("srtt_us", "Nullable(Int64)"),
    _c("retransmits", "Nullable(UInt32)"),
    _c("ws_seq", "UInt32", _INT),  # 0 = not a WebSocket exchange
    _c("partial", "Bool"),
    _c("client_aborted", "Bool"),
    _c("traceparent_missed", "Bool"),
    _c("attributes", "Map(LowCardinality(String), String)"),  # every other attribute
)
# GPU time beside the request (parallax_contracts.span_attributes.GPU, migration 3): one
# column per attribute, named as the agent's JSONL field. Nullable: absent is not zero
# (no GPU process, no NVML, a window without samples); the UUID list is '' when absent.
SPAN_GPU_COLUMNS: tuple[Column, ...] = (
    _c("gpu_prefill_launches", "Nullable(UInt32)"),
    _c("gpu_decode_launches", "Nullable(UInt32)"),
    _c("gpu_prefill_wait_us", "Nullable(Int64)"),
    _c("gpu_decode_wait_us", "Nullable(Int64)"),
    _c("gpu_prefill_sm_util_pct", "Nullable(Float64)"),  # 0–100
    _c("gpu_decode_sm_util_pct", "Nullable(Float64)"),
    _c("gpu_sample_coverage", "Nullable(Float64)"),  # 0–1
    _c("gpu_inflight_mean", "Nullable(Float64)"),
    _c("gpu_uuid", "LowCardinality(String)"),  # comma-separated NVML UUIDs
)
# The sampling a span states (migration 4): OpenTelemetry's rejection threshold from its
# tracestate ``ot=th:…`` (parallax_contracts.sampling), 0 when it states none — every request
# kept (keep probability 1, adjusted count 1).
SPAN_SAMPLING_COLUMNS: tuple[Column, ...] = (_c("sample_th", "UInt64", _INT),)


def adjusted_count_sql(th: str = "sample_th") -> str:
    """SQL for the adjusted count (1/p, the requests a record stands for) of a threshold
    column: p = 1 − th / 2^56 (parallax_contracts.sampling.adjusted_count)."""
    return f"(1 / (1 - {th} / 72057594037927936))"


# Write-to-wire holdback (parallax_contracts.span_attributes.WIRE_HOLD, migration 5): computed
# by the store from the span's `attributes`, where both parsers keep the parallax.wire_hold.*
# attributes as text; so no parser changes, the row tuples keep their order, and rows written
# before read as absent (NULL, ''). Not in SPAN_COLUMNS: an insert never lists them.
_ATTR = "attributes['parallax.wire_hold.{}']"
SPAN_HOLD_COLUMNS: tuple[Column, ...] = (
    _c(
        "wire_hold_writes",
        f"Nullable(UInt32) MATERIALIZED toUInt32OrNull({_ATTR.format('writes')})",
    ),
    _c("wire_hold_max_us", f"Nullable(Int64) MATERIALIZED toInt64OrNull({_ATTR.format('max_us')})"),
    _c("wire_hold_reason", f"LowCardinality(String) MATERIALIZED {_ATTR.format('reason')}"),
)

# The row tuples the parsers build follow this order (the v1 columns, the GPU ones, then the
# sampling threshold).
SPAN_COLUMNS: tuple[Column, ...] = _SPAN_COLUMNS_V1 + SPAN_GPU_COLUMNS + SPAN_SAMPLING_COLUMNS

# browser_entries as migration 1 created it: shipped, never edited (later columns are ALTERs).
_ENTRY_COLUMNS_V1: tuple[Column, ...] = (
    _c("time", "DateTime64(6, 'UTC')", _TIME9),  # time_origin + start_ms
    _c("received", "DateTime64(3, 'UTC')", _TIME9),
    _c("site", "LowCardinality(String)"),
    _c("session", "String"),
    _c("page", "String"),
    _c("trace_id", "String"),
    _c("span_id", "String"),  # the browser's span = the server span's parent
    _c("kind", "LowCardinality(String)"),  # fetch/xhr/eventsource/websocket/navigation
    _c("seq", "UInt32", _INT),  # WebSocket exchange number, 0 otherwise
    _c("method", "LowCardinality(String)"),
    _c("url", "String"),
    _c("route", "LowCardinality(String)"),  # route_template(url path)
    _c("status", "Nullable(UInt16)"),
    _c("time_origin_ms", "Float64", _FLOAT),  # performance.timeOrigin, Unix ms
    _c("start_ms", "Float64", _FLOAT),  # the rest: ms relative to time_origin_ms
    _c("request_start_ms", "Nullable(Float64)"),  # t0
    _c("response_start_ms", "Nullable(Float64)"),  # t3
    _c("response_end_ms", "Nullable(Float64)"),
    _c("dns_ms", "Nullable(Float64)"),
    _c("connect_ms", "Nullable(Float64)"),
    _c("tls_ms", "Nullable(Float64)"),
    _c("first_chunk_ms", "Nullable(Float64)"),
    _c("chunk_ms", "Array(Float64)"),
    _c("chunks", "Nullable(UInt32)"),
    _c("rendered_ms", "Nullable(Float64)"),
    _c("coarse", "Bool"),
    _c("chunks_coarse", "Bool"),
    _c("hidden", "Bool"),
    _c("transfer_size", "Nullable(UInt64)"),
    _c("protocol", "LowCardinality(String)"),
    _c("server_timing", "String"),  # JSON array of the entry's ServerTimings ('' when absent)
    _c("error", "LowCardinality(String)"),
    _c("clock_drift_ms", "Nullable(Float64)"),
    _c("sdk", "LowCardinality(String)"),
)
# The row tuples the beacon parser builds: the v1 columns, then the beacon v2 llm object's
# (migration 6; collector/store/llm_columns.py).
ENTRY_COLUMNS: tuple[Column, ...] = _ENTRY_COLUMNS_V1 + ENTRY_LLM_COLUMNS

# The pairs table is the SLA checker's input: see docs/store.md for each column's meaning.
# As migration 1 created it: shipped, never edited (later columns are ALTERs).
_PAIR_COLUMNS_V1: tuple[Column, ...] = (
    _c("time", "DateTime64(6, 'UTC')", _TIME9),  # browser entry start (UTC)
    _c("version", "UInt64", _INT),  # ReplacingMergeTree version: pairing time, ns
    _c("paired_at", "DateTime64(3, 'UTC')", _TIME9),
    _c("site", "LowCardinality(String)"),
    _c("session", "String"),
    _c("service", "LowCardinality(String)"),  # origin hop
    _c("route", "LowCardinality(String)"),  # origin hop's route, else the browser's
    _c("method", "LowCardinality(String)"),
    _c("status", "UInt16", _INT),
    _c("kind", "LowCardinality(String)"),
    _c("trace_id", "String"),
    _c("span_id", "String"),  # browser span id
    _c("seq", "UInt32", _INT),
    _c("coarse", "Bool"),
    _c("chunks_coarse", "Bool"),
    # user side (browser clock)
    _c("user_ttfb_ms", "Nullable(Float64)"),
    _c("user_ttft_ms", "Nullable(Float64)"),
    _c("user_visible_ttft_ms", "Nullable(Float64)"),
    _c("user_duration_ms", "Nullable(Float64)"),
    _c("user_itl_ms", "Array(Float64)"),
    _c("render_delay_ms", "Nullable(Float64)"),
    # server side (origin hop, server clock)
    _c("server_ttfb_ms", "Nullable(Float64)"),
    _c("server_ttft_ms", "Nullable(Float64)"),
    _c("server_duration_ms", "Nullable(Float64)"),
    _c("server_itl_ms", "Array(Float64)"),
    _c("server_timed", "Bool"),  # origin had the agent's kernel timings
    # hops
    _c("hops", "UInt8", _INT),
    _c("hop_span_ids", "Array(String)"),  # arrival order: [edge, …, origin]
    _c("hop_services", "Array(LowCardinality(String))"),
    _c("hop_added_ms", "Array(Float64)"),
    _c("edge_itl_ms", "Array(Float64)"),
    _c("linked_span_ids", "Array(String)"),  # SDK spans folded into an agent hop
    _c("reconnects", "UInt16", _INT),
    # the parts of the divergence
    _c("network_ms", "Nullable(Float64)"),  # δ against the edge hop
    _c("queue_ms", "Nullable(Float64)"),  # origin t1 − t_arr
    _c("accept_queue_ms", "Nullable(Float64)"),  # max(0, t_acc − t_arr)
    _c("recv_queue_ms", "Nullable(Float64)"),  # t1 − max(t_arr, t_acc)
    _c("retransmits", "Nullable(UInt32)"),  # edge hop
    _c("srtt_ms", "Nullable(Float64)"),  # edge hop
    # clock offset sample (NTP): server clock − browser clock
    _c("theta_ms", "Nullable(Float64)"),
    _c("theta_delay_ms", "Nullable(Float64)"),
)
# The pair's sampling (migration 4): the lowest threshold among its entry's server spans.
# Under consistent sampling (every hop decides on the trace id's randomness) the pair exists
# when any of them was kept, so its adjusted count is that of the most permissive one.
PAIR_SAMPLING_COLUMNS: tuple[Column, ...] = (_c("sample_th", "UInt64", _INT),)
# Write-to-wire holdback of the origin hop (migration 5): the longest wait of a body write's
# last byte in the socket (ms) and its reason (`nagle`, `sndbuf`, …; '' when not measured).
PAIR_HOLD_COLUMNS: tuple[Column, ...] = (
    _c("wire_hold_ms", "Nullable(Float64)"),
    _c("wire_hold_reason", "LowCardinality(String)"),
)
# How long the edge hop's connection waited to send bytes again during this request
# (migration 7; the agent's parallax.retransmit_wait_us, docs/agent.md): NULL when it had no
# retransmit or none could be timed.
PAIR_RETRANSMIT_COLUMNS: tuple[Column, ...] = (_c("retransmit_wait_ms", "Nullable(Float64)"),)
# An LLM exchange's tokens, first token, gaps and engine queue (migration 6; llm_columns.py).
PAIR_COLUMNS: tuple[Column, ...] = (
    _PAIR_COLUMNS_V1
    + PAIR_SAMPLING_COLUMNS
    + PAIR_HOLD_COLUMNS
    + PAIR_LLM_COLUMNS
    + PAIR_RETRANSMIT_COLUMNS
)


# One row per metric point of the GPU series (parallax_contracts.agent_metrics DEVICE and
# PROCESS), as sent: gauges' readings, sums as sent (cumulative ones with their start).
GPU_SAMPLE_COLUMNS: tuple[Column, ...] = (
    _c("time", "DateTime64(9, 'UTC')", _TIME9),  # the point's time_unix_nano
    _c("start_time", "Nullable(DateTime64(9, 'UTC'))"),  # sums: start of the accumulation
    _c("host", "LowCardinality(String)"),  # resource host.name
    _c("service", "LowCardinality(String)"),  # point's service.name, else the resource's
    _c("hw_id", "LowCardinality(String)"),  # hw.id = GPU UUID; '' for per-process series
    _c("hw_name", "LowCardinality(String)"),
    _c("pid", "UInt32", _INT),  # process.pid of per-process series; 0 for device series
    _c("metric", "LowCardinality(String)"),
    _c("value", "Float64", _FLOAT),
    _c("temporality", "LowCardinality(String)"),  # '' gauge, 'cumulative' or 'delta' sum
    _c("attributes", "Map(LowCardinality(String), String)"),  # the point's other attributes
)


# One row per OTLP metric point of the agent's request counts (parallax_contracts.agent_metrics
# SAMPLING): cumulative counters per server.port (rates: differences within one start_time,
# per host), and the sampling probability gauge (port 0).
REQUEST_COUNT_COLUMNS: tuple[Column, ...] = (
    _c("time", "DateTime64(9, 'UTC')", _TIME9),  # the point's time_unix_nano
    _c("start_time", "Nullable(DateTime64(9, 'UTC'))"),  # sums: start of the accumulation
    _c("host", "LowCardinality(String)"),  # resource host.name: one agent per node
    _c("service", "LowCardinality(String)"),  # point's service.name; '' until the agent knows
    _c("port", "UInt16", _INT),  # server.port; 0 for the probability gauge
    _c("metric", "LowCardinality(String)"),
    _c("value", "Float64", _FLOAT),
    _c("temporality", "LowCardinality(String)"),  # '' gauge, 'cumulative' or 'delta' sum
)


# How each table is spread over a cluster's shards (collector/store/layout.py): by trace id
# for everything pairing reads — a trace's spans, entries, pairs and trace-id rows land on
# one shard, so a subquery joining them stays on its shard (distributed_product_mode =
# 'local') and the copies a ReplacingMergeTree collapses (a retried span, a rewritten pair)
# meet under FINAL; by host for the metric points, whose identity includes the host (an
# exporter's retry lands beside the original); None: held whole on every node.
TRACE_KEY = "cityHash64(trace_id)"
HOST_KEY = "cityHash64(host)"
SHARD_BY: dict[str, str | None] = {
    MIGRATIONS: None,
    SPANS: TRACE_KEY,
    ENTRIES: TRACE_KEY,
    PAIRS: TRACE_KEY,
    SPAN_TRACES: TRACE_KEY,
    ENTRY_TRACES: TRACE_KEY,
    GPU_SAMPLES: HOST_KEY,
    REQUEST_COUNTS: HOST_KEY,
}
# The tables holding data (TTL, merge settings): all but the bookkeeping.
DATA_TABLES = (SPANS, ENTRIES, PAIRS, SPAN_TRACES, ENTRY_TRACES, GPU_SAMPLES, REQUEST_COUNTS)


def _table(
    lay: Layout, db: str, name: str, cols: tuple[Column, ...], engine: str, tail: str, rest: str
) -> list[str]:
    body = ",\n    ".join(c.ddl() for c in cols)
    return lay.table(db, name, f"    {body}{tail}", engine, rest, SHARD_BY[name])


def _ttl(days: int, col: str = "time") -> str:
    return f"TTL toDateTime({col}) + toIntervalDay({days})"


def _settings(lay: Layout) -> str:
    dedup = lay.dedup_settings(DEDUP_WINDOW)
    return f"SETTINGS index_granularity = 8192, ttl_only_drop_parts = 1, {dedup}"


_TRACE_INDEX = ",\n    INDEX idx_trace_id trace_id TYPE bloom_filter(0.001) GRANULARITY 1"


def _add_columns(lay: Layout, db: str, *tables: tuple[str, tuple[Column, ...]]) -> list[str]:
    """A migration's ALTER statements adding each table's new columns (on a cluster: to the
    local tables and the Distributed ones above them)."""
    return [
        stmt
        for t, cols in tables
        for c in cols
        for stmt in lay.alter(db, t, f"ADD COLUMN IF NOT EXISTS {c.ddl()}", SHARD_BY[t])
    ]


_LLM_TABLES = ((SPANS, SPAN_LLM_COLUMNS), (ENTRIES, ENTRY_LLM_COLUMNS), (PAIRS, PAIR_LLM_COLUMNS))


def _add_columns_at_once(
    lay: Layout, db: str, *tables: tuple[str, tuple[Column, ...]]
) -> list[str]:
    """As _add_columns, one ALTER per table for all its new columns (a migration adding
    dozens: each ALTER costs the store a metadata commit, ≈ 50 ms on the embedded one)."""
    return [
        stmt
        for t, cols in tables
        for stmt in lay.alter(
            db, t, ",\n    ".join(f"ADD COLUMN IF NOT EXISTS {c.ddl()}" for c in cols), SHARD_BY[t]
        )
    ]


def migrations(
    db: str, retention_days: int, cluster: str | None = None
) -> list[tuple[int, str, list[str]]]:
    """(version, name, statements) in order. Never edit a shipped version: add a new one.
    ``cluster``: the same versions rendered ON CLUSTER (collector/store/layout.py)."""
    lay = Layout(cluster)
    return [(version, name, ddl(lay, db, retention_days)) for version, name, ddl in _VERSIONS]


_DAILY = "\nPARTITION BY toDate(time)"


def _daily(lay: Layout, days: int, order_by: str) -> str:
    """What follows a data table's engine: a partition a day, the sort key, the TTL, the
    settings."""
    return f"{_DAILY}\nORDER BY ({order_by})\n{_ttl(days)}\n{_settings(lay)}"


def _v1_spans_entries_pairs(lay: Layout, db: str, days: int) -> list[str]:
    return [
        lay.database(db),
        *lay.table(
            db,
            MIGRATIONS,
            "    version UInt32, name String, applied_at DateTime64(3, 'UTC') DEFAULT now64(3)",
            "ReplacingMergeTree",
            " ORDER BY version",
            SHARD_BY[MIGRATIONS],
        ),
        *_table(
            lay,
            db,
            SPANS,
            _SPAN_COLUMNS_V1,
            "ReplacingMergeTree",
            _TRACE_INDEX,
            _daily(lay, days, "service, route, toDateTime(time), trace_id, span_id"),
        ),
        *_table(
            lay,
            db,
            ENTRIES,
            _ENTRY_COLUMNS_V1,
            "ReplacingMergeTree",
            _TRACE_INDEX,
            _daily(lay, days, "site, route, toDateTime(time), trace_id, span_id, seq"),
        ),
        *_table(
            lay,
            db,
            PAIRS,
            _PAIR_COLUMNS_V1,
            "ReplacingMergeTree(version)",
            _TRACE_INDEX + ",\n    INDEX idx_route route TYPE set(1000) GRANULARITY 4",
            _daily(lay, days, "site, time, trace_id, span_id, seq"),
        ),
        lay.view(db, "pairs_final", f"SELECT * FROM {db}.{PAIRS} FINAL"),  # noqa: S608
    ]


def _v2_trace_lookups(lay: Layout, db: str, days: int) -> list[str]:
    return [
        stmt
        for name, source in ((SPAN_TRACES, SPANS), (ENTRY_TRACES, ENTRIES))
        for stmt in (
            *lay.table(
                db,
                name,
                "    `trace_id` String CODEC(ZSTD(1)),\n"
                "    `time` DateTime64(6, 'UTC') CODEC(Delta, ZSTD(1))",
                "MergeTree",
                f"{_DAILY}\nORDER BY trace_id\n{_ttl(days)}"
                "\nSETTINGS index_granularity = 8192, ttl_only_drop_parts = 1",
                SHARD_BY[name],
            ),
            lay.materialized_view(
                db,
                f"{name}_mv",
                (name, SHARD_BY[name]),
                "trace_id, time",
                (source, SHARD_BY[source]),
            ),
            # Rows written before this version (a repeat after a crash only adds duplicates,
            # harmless for an existence lookup).
            f"INSERT INTO {db}.{name} SELECT trace_id, time FROM {db}.{source} "  # noqa: S608
            f"WHERE time >= now64() - toIntervalDay({days})",
        )
    ]


def _v3_gpu(lay: Layout, db: str, days: int) -> list[str]:
    return [
        *_add_columns(lay, db, (SPANS, SPAN_GPU_COLUMNS)),
        # The clock join (collector/sla/gpu_source.py) reads one GPU's clock series over a
        # time range: (hw_id, metric) first. The key ends with the point's identity, so an
        # exporter's retry of the same points collapses (ReplacingMergeTree).
        *_table(
            lay,
            db,
            GPU_SAMPLES,
            GPU_SAMPLE_COLUMNS,
            "ReplacingMergeTree",
            "",
            _daily(lay, days, "hw_id, metric, host, pid, time"),
        ),
    ]


def _v4_sampling(lay: Layout, db: str, days: int) -> list[str]:
    return [
        *_add_columns(lay, db, (SPANS, SPAN_SAMPLING_COLUMNS), (PAIRS, PAIR_SAMPLING_COLUMNS)),
        # "Traced X % of a service's requests": one service's ports over a time range, so
        # (service, port) first; the key ends with the point's identity (host, metric, time),
        # so an exporter's retry collapses — and two ports' points of one export do not.
        *_table(
            lay,
            db,
            REQUEST_COUNTS,
            REQUEST_COUNT_COLUMNS,
            "ReplacingMergeTree",
            "",
            _daily(lay, days, "service, port, host, metric, time"),
        ),
    ]


def _v5_holdback(lay: Layout, db: str, days: int) -> list[str]:
    return _add_columns(lay, db, (SPANS, SPAN_HOLD_COLUMNS), (PAIRS, PAIR_HOLD_COLUMNS))


def _v6_llm(lay: Layout, db: str, days: int) -> list[str]:
    return _add_columns_at_once(lay, db, *_LLM_TABLES)


def _v7_retransmit_wait(lay: Layout, db: str, days: int) -> list[str]:
    return _add_columns(lay, db, (PAIRS, PAIR_RETRANSMIT_COLUMNS))


# Every version: (number, name as recorded in schema_migrations, its statements).
_VERSIONS: tuple[tuple[int, str, Callable[[Layout, str, int], list[str]]], ...] = (
    (1, "spans, browser entries, pairs", _v1_spans_entries_pairs),
    (2, "trace id lookup tables", _v2_trace_lookups),
    (3, "GPU span columns, gpu_samples", _v3_gpu),
    (4, "sampling thresholds of spans and pairs, request_counts", _v4_sampling),
    (5, "write-to-wire holdback of spans and pairs", _v5_holdback),
    (6, "LLM streams of spans, browser entries and pairs", _v6_llm),
    (7, "retransmit waits of pairs", _v7_retransmit_wait),
)


_DB_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")


def check_database_name(db: str) -> str:
    if not _DB_NAME.fullmatch(db):
        raise ValueError(f"invalid database name {db!r}")
    return db


def applied_versions(client: Executor, db: str) -> set[int]:
    rows = scalar_rows(client, f"SELECT DISTINCT version FROM {db}.{MIGRATIONS}")  # noqa: S608
    return {int(str(r[0])) for r in rows}


def migrate(
    client: Executor,
    db: str,
    retention_days: int = DEFAULT_RETENTION_DAYS,
    cluster: str | None = None,
) -> list[int]:
    """Apply the missing migrations in order and align the TTL; returns the versions applied.
    ``cluster``: the store is that ClickHouse cluster (every statement ON CLUSTER)."""
    check_database_name(db)
    if retention_days < 1:
        raise ValueError("retention must be at least 1 day")
    lay = Layout(cluster)
    steps = migrations(db, retention_days, cluster)
    # The first statements of v1 create the bookkeeping table itself (idempotent).
    for stmt in steps[0][2][:2]:
        client.command(stmt)
    done = applied_versions(client, db)
    applied = []
    for version, name, stmts in steps:
        if version in done:
            continue
        for stmt in stmts:
            client.command(stmt)
        client.command(
            # db is a checked identifier; version and name are our own constants.
            f"INSERT INTO {db}.{MIGRATIONS} (version, name) VALUES ({version}, '{name}')"  # noqa: S608
        )
        applied.append(version)
    # then the data tables' settings (collector/store/upkeep.py)
    tables = [lay.local(name, SHARD_BY[name]) for name in DATA_TABLES]
    align_ttl(client, db, retention_days, lay.on, tables)
    tune_merges(client, db, lay.on, tables)
    return applied


def column_names(cols: tuple[Column, ...]) -> list[str]:
    return [c.name for c in cols]
