"""DDL of the SLA checker's own tables (prefix ``sla_``), idempotent, applied at start.

- ``sla_minutes``  per (minute, service, route, series): a histogram on the grid of
                   ``quantize`` as parallel arrays (cells, counts), with each cell's sum of
                   the pairs' adjusted counts and of their squares (``weights``,
                   ``weights2``; totals ``w``, ``w2``): the weighted quantiles and the
                   effective sample size of a sampled window. ReplacingMergeTree on
                   ``version``: a minute is re-summarized whole when pairs in it change
                   (pairs are themselves rewritten when a late hop arrives), so a
                   materialized view on ``pairs`` would count a rewritten pair twice.
- ``sla_blocks``   the complete minutes of the current window merged into one histogram
                   per series (rebuilt once a minute, or when one of its minutes is
                   re-summarized): an evaluation reads it plus the current minute.
- ``sla_sessions`` per browser session: the 8 best clock samples (``best``; their times in
                   ``best_ms``, added by an ALTER for tables made before it) and the
                   filtered θ.
- ``sla_alerts``   one row per alert state change, with the numbers and the sentence.
- ``sla_lease``    who evaluates (several collectors on one ClickHouse: one evaluator).
- ``sla_state``    small key/values (the summarizer's watermark).

Same oldest server as the rest of the store (22.3): plain MergeTree families, arrays,
tuples, LowCardinality; no features newer than the pairs table uses. The weight columns were
added by an ALTER with DEFAULTs computed from ``n`` and ``counts``: rows summarized before
them (no sampling then) read weight 1 per pair.
"""

from __future__ import annotations

from typing import Protocol

MINUTES = "sla_minutes"
BLOCKS = "sla_blocks"
SESSIONS = "sla_sessions"
ALERTS = "sla_alerts"
LEASE = "sla_lease"
STATE = "sla_state"
RETENTION_DAYS = 8
# sla_blocks holds the current window only: its rows expire a day after their window ends
BLOCK_TTL_DAYS = 1


# The weight columns of the two histogram tables; for rows written before they existed the
# DEFAULT reads each pair as weight 1 (then w = w2 = n, weights = weights2 = counts).
_WEIGHTS = (
    ("w", "Float64 DEFAULT toFloat64(n)"),
    ("w2", "Float64 DEFAULT toFloat64(n)"),
    ("weights", "Array(Float64) DEFAULT arrayMap(c -> toFloat64(c), counts) CODEC(ZSTD(1))"),
    ("weights2", "Array(Float64) DEFAULT arrayMap(c -> toFloat64(c), counts) CODEC(ZSTD(1))"),
)
_WEIGHT_DDL = "".join(f"\n    {name} {ddl}," for name, ddl in _WEIGHTS)


class Commander(Protocol):
    def command(self, cmd: str) -> object: ...


def statements(db: str) -> list[str]:
    return [
        f"CREATE DATABASE IF NOT EXISTS {db}",
        f"""CREATE TABLE IF NOT EXISTS {db}.{MINUTES}
(
    minute DateTime('UTC'),
    service LowCardinality(String),
    route LowCardinality(String),
    series LowCardinality(String),
    n UInt64,
    cells Array(Int32) CODEC(ZSTD(1)),
    counts Array(UInt64) CODEC(ZSTD(1)),{_WEIGHT_DDL}
    version UInt64
) ENGINE = ReplacingMergeTree(version)
PARTITION BY toDate(minute)
ORDER BY (minute, service, route, series)
TTL minute + toIntervalDay({RETENTION_DAYS})
SETTINGS ttl_only_drop_parts = 1""",
        f"""CREATE TABLE IF NOT EXISTS {db}.{BLOCKS}
(
    start_minute DateTime('UTC'),
    end_minute DateTime('UTC'),
    service LowCardinality(String),
    route LowCardinality(String),
    series LowCardinality(String),
    n UInt64,
    cells Array(Int32) CODEC(ZSTD(1)),
    counts Array(UInt64) CODEC(ZSTD(1)),{_WEIGHT_DDL}
    version UInt64
) ENGINE = ReplacingMergeTree(version)
PARTITION BY toDate(end_minute)
ORDER BY (end_minute, start_minute, service, route, series)
TTL end_minute + toIntervalDay({BLOCK_TTL_DAYS})
SETTINGS ttl_only_drop_parts = 1""",
        f"""CREATE TABLE IF NOT EXISTS {db}.{SESSIONS}
(
    session String,
    site LowCardinality(String),
    routes Array(Tuple(String, String)),
    best Array(Tuple(Float64, Float64, String)),
    best_ms Array(Int64),
    theta_ms Float64,
    delay_ms Float64,
    used UInt8,
    last_seen DateTime64(3, 'UTC'),
    version UInt64
) ENGINE = ReplacingMergeTree(version)
ORDER BY session
TTL toDateTime(last_seen) + toIntervalDay({RETENTION_DAYS})""",
        *(
            f"ALTER TABLE {db}.{t} ADD COLUMN IF NOT EXISTS {name} {ddl} AFTER {prev}"
            for t in (MINUTES, BLOCKS)
            for (name, ddl), prev in zip(_WEIGHTS, ("counts", "w", "w2", "weights"), strict=True)
        ),
        f"ALTER TABLE {db}.{SESSIONS} ADD COLUMN IF NOT EXISTS best_ms Array(Int64) AFTER best",
        f"""CREATE TABLE IF NOT EXISTS {db}.{ALERTS}
(
    time DateTime64(3, 'UTC'),
    service LowCardinality(String),
    route LowCardinality(String),
    metric LowCardinality(String),
    state LowCardinality(String),
    previous LowCardinality(String),
    severity LowCardinality(String),
    verdict LowCardinality(String),
    since DateTime64(3, 'UTC'),
    divergence_ms Nullable(Float64),
    ci_low_ms Nullable(Float64),
    ci_high_ms Nullable(Float64),
    band_ms Float64,
    n UInt64,
    user_p95_ms Nullable(Float64),
    server_p95_ms Nullable(Float64),
    sentence String,
    evaluator String
) ENGINE = MergeTree
PARTITION BY toDate(time)
ORDER BY (service, route, metric, time)
TTL toDateTime(time) + toIntervalDay(30)""",
        f"""CREATE TABLE IF NOT EXISTS {db}.{LEASE}
(
    name String,
    holder String,
    expires DateTime64(3, 'UTC'),
    version UInt64
) ENGINE = ReplacingMergeTree(version)
ORDER BY name""",
        f"""CREATE TABLE IF NOT EXISTS {db}.{STATE}
(
    key String,
    value String,
    version UInt64
) ENGINE = ReplacingMergeTree(version)
ORDER BY key""",
    ]


def ensure(client: Commander, db: str) -> None:
    for stmt in statements(db):
        client.command(stmt)
