"""What migrate() (collector/store/schema.py) does after the migrations, at every start: the
data tables' settings brought in line — the TTL with --retention-days, the merge selector's
base with MERGE_SELECTOR_BASE. Unlike a migration, these follow the collector's options and
its code, so they are checked and rewritten each time, never recorded as applied."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol


class _Result(Protocol):
    @property
    def result_rows(self) -> list[Any]: ...


class Executor(Protocol):
    """What migrate() needs from a store client (clickhouse-connect's Client has it)."""

    def command(self, cmd: str) -> object: ...

    def query(self, query: str) -> _Result: ...


def scalar_rows(client: Executor, sql: str) -> list[Any]:
    return list(client.query(sql).result_rows)


MERGE_SELECTOR_BASE = 10


def tune_merges(client: Executor, db: str, on: str, tables: Sequence[str]) -> None:
    """Fewer, wider background merges: ``merge_selector_base`` 10 (ClickHouse's default 5).

    Every row is rewritten once per merge level; a wider base means fewer levels, so about
    half the merge CPU per row (measured on the embedded store, where merges run in the
    collector's process: docs/store.md), for a few more parts alive between merges. Which
    parts merge when changes nothing a query sees (ReplacingMergeTree collapses at merge or
    under FINAL either way; insert deduplication tokens are kept per table, not per part).
    A server too old to know the setting keeps its default.
    """
    known = scalar_rows(
        client, "SELECT count() FROM system.merge_tree_settings WHERE name = 'merge_selector_base'"
    )
    if not known or not int(str(known[0][0])):
        return
    want = f"merge_selector_base = {MERGE_SELECTOR_BASE}"
    for table, ddl in _table_ddl(client, db, tables).items():
        if want not in ddl:
            client.command(f"ALTER TABLE {db}.{table}{on} MODIFY SETTING {want}")


def _table_ddl(client: Executor, db: str, tables: Sequence[str]) -> dict[str, str]:
    """The CREATE statement of each of ``tables`` that exists (on a cluster: the local
    table, as the node the client reached shows it), by that table's name."""
    out: dict[str, str] = {}
    for table in tables:
        rows = scalar_rows(
            client,
            f"SELECT create_table_query FROM system.tables "  # noqa: S608
            f"WHERE database = '{db}' AND name = '{table}'",
        )
        if rows:
            out[table] = str(rows[0][0])
    return out


def align_ttl(client: Executor, db: str, days: int, on: str, tables: Sequence[str]) -> None:
    """A changed retention setting rewrites the TTL; old parts are not rewritten (cheap)."""
    want = f"toIntervalDay({days})"
    for table, ddl in _table_ddl(client, db, tables).items():
        if want not in ddl:
            client.command(
                f"ALTER TABLE {db}.{table}{on} MODIFY TTL toDateTime(time) + {want} "
                "SETTINGS materialize_ttl_after_modify = 0"
            )
