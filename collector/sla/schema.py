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

from typing import NamedTuple, Protocol

from collector.store.layout import Layout

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


# On a cluster (collector/store/layout.py): the browser sessions, one row each, grow with the
# traffic and are sharded by session (a session's versions meet under FINAL on its shard);
# the rest is small and held whole on every node — read where the query lands, written by
# the one evaluator (the lease) and copied to every node by replication.
SHARD_BY: dict[str, str | None] = {
    MINUTES: None,
    BLOCKS: None,
    SESSIONS: "cityHash64(session)",
    ALERTS: None,
    LEASE: None,
    STATE: None,
}


class _Table(NamedTuple):
    """One table's CREATE statement, in the parts Layout.table takes."""

    columns: str
    engine: str
    rest: str  # after the engine: partitioning, key, TTL, settings


# What a minute and a block hold after their time columns: one series' sketch of a route.
_SKETCH_DDL = f"""    service LowCardinality(String),
    route LowCardinality(String),
    series LowCardinality(String),
    n UInt64,
    cells Array(Int32) CODEC(ZSTD(1)),
    counts Array(UInt64) CODEC(ZSTD(1)),{_WEIGHT_DDL}
    version UInt64"""


# Each table as a new store creates it (the columns added since to older stores: _ADDED).
_TABLES = {
    MINUTES: _Table(
        f"""    minute DateTime('UTC'),
{_SKETCH_DDL}""",
        "ReplacingMergeTree(version)",
        f"""
PARTITION BY toDate(minute)
ORDER BY (minute, service, route, series)
TTL minute + toIntervalDay({RETENTION_DAYS})
SETTINGS ttl_only_drop_parts = 1""",
    ),
    BLOCKS: _Table(
        f"""    start_minute DateTime('UTC'),
    end_minute DateTime('UTC'),
{_SKETCH_DDL}""",
        "ReplacingMergeTree(version)",
        f"""
PARTITION BY toDate(end_minute)
ORDER BY (end_minute, start_minute, service, route, series)
TTL end_minute + toIntervalDay({BLOCK_TTL_DAYS})
SETTINGS ttl_only_drop_parts = 1""",
    ),
    SESSIONS: _Table(
        """    session String,
    site LowCardinality(String),
    routes Array(Tuple(String, String)),
    best Array(Tuple(Float64, Float64, String)),
    best_ms Array(Int64),
    theta_ms Float64,
    delay_ms Float64,
    used UInt8,
    last_seen DateTime64(3, 'UTC'),
    version UInt64""",
        "ReplacingMergeTree(version)",
        f"""
ORDER BY session
TTL toDateTime(last_seen) + toIntervalDay({RETENTION_DAYS})""",
    ),
    ALERTS: _Table(
        """    time DateTime64(3, 'UTC'),
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
    evaluator String""",
        "MergeTree",
        """
PARTITION BY toDate(time)
ORDER BY (service, route, metric, time)
TTL toDateTime(time) + toIntervalDay(30)""",
    ),
    LEASE: _Table(
        """    name String,
    holder String,
    expires DateTime64(3, 'UTC'),
    version UInt64""",
        "ReplacingMergeTree(version)",
        "\nORDER BY name",
    ),
    STATE: _Table(
        """    key String,
    value String,
    version UInt64""",
        "ReplacingMergeTree(version)",
        "\nORDER BY key",
    ),
}
# The columns added after their table was first shipped (table, column, the column before
# it): ALTERs that bring a store made before them up to date, nothing on a new one.
_ADDED = (
    *(
        (t, f"{name} {ddl}", prev)
        for t in (MINUTES, BLOCKS)
        for (name, ddl), prev in zip(_WEIGHTS, ("counts", "w", "w2", "weights"), strict=True)
    ),
    (SESSIONS, "best_ms Array(Int64)", "best"),
)


def _create(lay: Layout, db: str, name: str) -> list[str]:
    t = _TABLES[name]
    return lay.table(db, name, t.columns, t.engine, t.rest, SHARD_BY[name])


def _add_columns(lay: Layout, db: str) -> list[str]:
    return [
        stmt
        for t, column, prev in _ADDED
        for stmt in lay.alter(db, t, f"ADD COLUMN IF NOT EXISTS {column} AFTER {prev}", SHARD_BY[t])
    ]


def statements(db: str, cluster: str | None = None) -> list[str]:
    """The database, each table, the columns added since: in this order (the ALTERs of
    sla_minutes, sla_blocks and sla_sessions follow their CREATEs)."""
    lay = Layout(cluster)
    return [
        lay.database(db),
        *_create(lay, db, MINUTES),
        *_create(lay, db, BLOCKS),
        *_create(lay, db, SESSIONS),
        *_add_columns(lay, db),
        *_create(lay, db, ALERTS),
        *_create(lay, db, LEASE),
        *_create(lay, db, STATE),
    ]


def ensure(client: Commander, db: str, cluster: str | None = None) -> None:
    for stmt in statements(db, cluster):
        client.command(stmt)
