"""Where the DDL lands: one ClickHouse server (the statements as written) or a cluster.

Every CREATE and ALTER of the store (collector/store/schema.py) and of the SLA checker's
tables (collector/sla/schema.py) is rendered here, so a table is declared once and the same
migrations run on both. On one server a statement is exactly what the schema writes. On a
cluster (``--cluster NAME``, docs/store.md "A ClickHouse cluster"):

- a table with a **sharding key** becomes a replicated local table ``<name>_local`` on every
  node, ``ON CLUSTER``, engine ``Replicated<same family>('/clickhouse/tables/{shard}/<db>/
  <name>_local', '{replica}'[, the family's own arguments])``, plus a ``Distributed`` table
  under the table's own name that writes rows to shards by that key and reads all shards
  — so every query keeps the name it uses today;
- a table **without one** (small tables: bookkeeping, the SLA checker's summaries, lease,
  alerts) is one replicated table holding everything on every node of the cluster, under its
  own name: path ``/clickhouse/tables/all/<db>/<name>``, replica ``'{shard}-{replica}'``
  (unique across the cluster even where replica names repeat per shard);
- materialized views read the local source and write the local target (each shard fills its
  own part of the target from its own rows), views and ALTERs run ``ON CLUSTER`` on the
  local table and on the Distributed one.

The ``{shard}`` and ``{replica}`` macros come from each server's configuration
(``<macros>``); the cluster from its ``<remote_servers>``, with
``<internal_replication>true</internal_replication>`` (the Distributed table writes one
replica per shard; replication copies it to the others).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

KEEPER_ROOT = "/clickhouse/tables"
LOCAL_SUFFIX = "_local"
# Insert-token deduplication on replicated tables: the blocks remembered per table and shard
# (kept the same as the single server's non_replicated_deduplication_window) and for how
# long. Set explicitly: the defaults moved between versions (22.3: 100 blocks, 7 days;
# 26.x: 10,000 blocks, 1 hour — a spool replayed after an hour's outage would double).
REPLICATED_DEDUP_SECONDS = 7 * 86400

_ENGINE = re.compile(r"(\w*MergeTree)(?:\((.*)\))?")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")


def check_cluster_name(name: str) -> str:
    """A cluster name as ``<remote_servers>`` declares it: an identifier (used unquoted)."""
    if not _NAME.fullmatch(name):
        raise ValueError(f"invalid cluster name {name!r} (letters, digits, _; not first a digit)")
    return name


@dataclass(frozen=True, slots=True)
class Layout:
    """Renders DDL for one server (``cluster`` None) or ``ON CLUSTER cluster``.

    ``shard`` arguments are the table's sharding expression (``cityHash64(trace_id)``) or
    None for a table held whole on every node."""

    cluster: str | None = None

    def __post_init__(self) -> None:
        if self.cluster is not None:
            check_cluster_name(self.cluster)

    @property
    def on(self) -> str:
        return f" ON CLUSTER {self.cluster}" if self.cluster else ""

    def local(self, name: str, shard: str | None) -> str:
        """The table that holds the rows (and takes TTL, settings, views' inserts)."""
        return name + LOCAL_SUFFIX if self.cluster and shard else name

    def database(self, db: str) -> str:
        return f"CREATE DATABASE IF NOT EXISTS {db}{self.on}"

    def table(
        self, db: str, name: str, body: str, engine: str, rest: str, shard: str | None
    ) -> list[str]:
        """CREATE TABLE from its column list ``body`` (without the parentheses), its MergeTree
        ``engine`` and what follows the engine (``rest``: PARTITION, ORDER, TTL, SETTINGS)."""
        local = self.local(name, shard)
        stmts = [
            f"CREATE TABLE IF NOT EXISTS {db}.{local}{self.on}\n(\n{body}\n) "
            f"ENGINE = {self.engine(engine, db, local, shard)}{rest}"
        ]
        if self.cluster and shard:
            stmts.append(
                f"CREATE TABLE IF NOT EXISTS {db}.{name}{self.on} AS {db}.{local}\n"
                f"ENGINE = Distributed({self.cluster}, {db}, {local}, {shard})"
            )
        return stmts

    def engine(self, engine: str, db: str, local: str, shard: str | None) -> str:
        if not self.cluster:
            return engine
        m = _ENGINE.fullmatch(engine)
        if m is None:
            raise ValueError(f"not a MergeTree engine: {engine}")
        family, args = m.group(1), m.group(2)
        path = f"{KEEPER_ROOT}/{'{shard}' if shard else 'all'}/{db}/{local}"
        replica = "{replica}" if shard else "{shard}-{replica}"
        return f"Replicated{family}('{path}', '{replica}'{', ' + args if args else ''})"

    def alter(self, db: str, name: str, clause: str, shard: str | None) -> list[str]:
        """``ALTER TABLE … clause`` on the table; on a cluster a column change goes to the
        local table and then to the Distributed table over it (both keep the same columns)."""
        stmts = [f"ALTER TABLE {db}.{self.local(name, shard)}{self.on} {clause}"]
        if self.cluster and shard:
            stmts.append(f"ALTER TABLE {db}.{name}{self.on} {clause}")
        return stmts

    def materialized_view(
        self,
        db: str,
        name: str,
        target: tuple[str, str | None],
        select: str,
        source: tuple[str, str | None],
    ) -> str:
        """``CREATE MATERIALIZED VIEW name TO target AS SELECT select FROM source``; on a
        cluster from the local source into the local target, on every node."""
        to, src = self.local(*target), self.local(*source)
        return (
            f"CREATE MATERIALIZED VIEW IF NOT EXISTS {db}.{name}{self.on} TO {db}.{to} "  # noqa: S608 — identifiers ours, checked
            f"AS SELECT {select} FROM {db}.{src}"
        )

    def view(self, db: str, name: str, select: str) -> str:
        return f"CREATE VIEW IF NOT EXISTS {db}.{name}{self.on} AS {select}"

    def dedup_settings(self, window: int) -> str:
        """The insert-token deduplication window of a table written with tokens."""
        if not self.cluster:
            return f"non_replicated_deduplication_window = {window}"
        return (
            f"replicated_deduplication_window = {window}, "
            f"replicated_deduplication_window_seconds = {REPLICATED_DEDUP_SECONDS}"
        )
