"""The cluster DDL (``--cluster NAME``, collector/store/layout.py) as ClickHouse's own parser
reads it. No ClickHouse server or Keeper runs here, so the replicated statements cannot be
executed; chDB is the ClickHouse 26.x engine, and every statement the collector and the SLA
checker would send to a fresh cluster — captured from ``migrate()`` and ``ensure()``
themselves, the TTL and merge-setting ALTERs included — goes through ``EXPLAIN AST`` and
``formatQuery``. The parsed forms are then held to the design: the same column declarations
as on one server, the replicated engine of the same family with the Keeper path convention,
Distributed tables over the local ones sharded as declared, ALTERs on both. The one-server
statements are held byte-equal to what shipped before the cluster layout
(``ddl_single_server.json``, from main): a shipped migration is never edited."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import defaultdict
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from collector.sla import schema as sla_schema
from collector.store import layout, schema
from collector.store.client import CLUSTER_SETTINGS, Store

HERE = Path(__file__).resolve().parent
CLUSTER = "parallax_cluster"
DB = "parallax"

# Answers the queries migrate() makes of a fresh store: nothing applied, no table yet
# (so the TTL and merge-setting ALTERs are made, as on a store whose settings differ), a
# server that knows merge_selector_base.
_PARSE = """
import json, sys, clickhouse_connect
c = clickhouse_connect.get_client(interface="chdb")
out = []
for s in json.load(sys.stdin):
    try:
        ast = [r[0] for r in c.query("EXPLAIN AST " + s).result_rows]
        f = c.query("SELECT formatQuery({s:String})", parameters={"s": s}).result_rows[0][0]
        out.append({"ast": ast, "formatted": f})
    except Exception as e:
        out.append({"error": str(e).splitlines()[0]})
print(json.dumps(out))
"""


class _Recorder:
    """A store client that records every statement and answers migrate()'s questions as a
    fresh store would."""

    def __init__(self) -> None:
        self.sent: list[str] = []

    def command(self, cmd: str) -> object:
        self.sent.append(cmd)
        return None

    def query(self, query: str) -> Any:
        rows: list[list[Any]] = []
        if "system.merge_tree_settings" in query:
            rows = [[1]]
        elif "system.tables" in query:
            rows = [["CREATE TABLE … (as an older version left it)"]]
        return type("R", (), {"result_rows": rows})()


def sent(cluster: str | None) -> list[str]:
    """Every statement a fresh store gets at the collector's start, in order: the store's
    migrations and alignments, then the SLA checker's tables."""
    rec = _Recorder()
    schema.migrate(rec, DB, 7, cluster)
    sla_schema.ensure(rec, DB, cluster)
    return rec.sent


@cache
def parsed(cluster: str | None) -> tuple[dict[str, Any], ...]:
    stmts = sent(cluster)
    p = subprocess.run(
        [sys.executable, "-c", _PARSE],
        input=json.dumps(stmts),
        capture_output=True,
        text=True,
        timeout=120,
        cwd=HERE.parents[1],
    )
    assert p.returncode == 0, p.stderr[-2000:]
    out: list[dict[str, Any]] = json.loads(p.stdout.strip().splitlines()[-1])
    assert len(out) == len(stmts)
    return tuple(dict(o, sql=s) for o, s in zip(out, stmts, strict=True))


def _subtrees(ast: list[str], label: str) -> list[str]:
    """Each node whose text starts with ``label``, with its descendants (indentation made
    relative), as one string."""
    out = []
    for i, line in enumerate(ast):
        depth = len(line) - len(line.lstrip())
        if line.strip().startswith(label):
            block = [line[depth:]]
            for more in ast[i + 1 :]:
                d = len(more) - len(more.lstrip())
                if d <= depth:
                    break
                block.append(more[depth:])
            out.append("\n".join(block))
    return out


def _target(p: dict[str, Any]) -> tuple[str, str] | None:
    """(kind, table) of a CREATE TABLE or ALTER TABLE, from the parsed query."""
    m = re.match(r"(CreateQuery|AlterQuery) (\w+) (\w+)", p["ast"][0])
    return (m.group(1), m.group(3)) if m and "VIEW" not in p["formatted"][:40] else None


def _columns_by_table(ps: tuple[dict[str, Any], ...]) -> dict[str, list[str]]:
    """Per table, its column declarations as parsed, in the order the statements make them
    (CREATE, then each ADD COLUMN)."""
    out: dict[str, list[str]] = defaultdict(list)
    for p in ps:
        t = _target(p)
        if t is not None:
            out[t[1]] += _subtrees(p["ast"], "ColumnDeclaration")
    return out


def test_the_one_server_migrations_are_the_ones_shipped() -> None:
    shipped = json.loads((HERE / "ddl_single_server.json").read_text())
    now = schema.migrations(shipped["database"], shipped["retention_days"])
    for old in shipped["migrations"]:
        version, name, stmts = now[old["version"] - 1]
        assert (version, name) == (old["version"], old["name"])
        assert stmts == old["statements"], f"migration {version} changed"
    # and the cluster rendering is another thing, not a change of these
    assert schema.migrations(DB, 7, CLUSTER)[0][2] != now[0][2]


def test_every_statement_parses_one_server_and_cluster() -> None:
    for cluster in (None, CLUSTER):
        for one in parsed(cluster):
            assert "error" not in one, (one["sql"][:200], one.get("error"))
    # the parser is not a rubber stamp: a broken statement is refused
    spans = next(s for s in sent(CLUSTER) if "server_spans_local" in s.splitlines()[0])
    broken = spans.replace("ORDER BY (", "ORDER BY ((")
    assert broken != spans
    p = subprocess.run(
        [sys.executable, "-c", _PARSE], input=json.dumps([broken]), capture_output=True, text=True
    )
    assert "Syntax error" in json.loads(p.stdout.strip().splitlines()[-1])[0]["error"]


def test_every_cluster_ddl_runs_on_cluster_and_inserts_do_not() -> None:
    for p in parsed(CLUSTER):
        f = p["formatted"]
        if f.startswith("INSERT"):
            assert " ON CLUSTER " not in f
        else:
            assert f" ON CLUSTER {CLUSTER}" in f.splitlines()[0], f[:120]
    assert not any(" ON CLUSTER " in p["formatted"] for p in parsed(None))


def test_the_cluster_creates_the_same_columns() -> None:
    single = _columns_by_table(parsed(None))
    cluster = _columns_by_table(parsed(CLUSTER))
    sharded = {**schema.SHARD_BY, **sla_schema.SHARD_BY}
    assert set(single) == set(sharded)
    # ADD COLUMN declarations per altered table, in order
    adds: dict[str, list[str]] = defaultdict(list)
    for p in parsed(CLUSTER):
        t = _target(p)
        if t is not None and t[0] == "AlterQuery":
            adds[t[1]] += _subtrees(p["ast"], "AlterCommand ADD_COLUMN")
    assert adds["server_spans_local"]  # the check sees the ALTERs it compares
    for table, shard in sharded.items():
        local = table + layout.LOCAL_SUFFIX if shard else table
        assert len(single[table]) >= 2, table
        assert cluster[local] == single[table], table
        if shard:
            # The Distributed table copies the local one's columns at CREATE (AS …): every
            # later ADD COLUMN goes to both, the same declaration.
            assert adds[table] == adds[local], table


_ENGINE = re.compile(r"ENGINE = (\w+)(?:\((.*)\))?$", re.M)


def _engines(ps: tuple[dict[str, Any], ...]) -> dict[str, tuple[str, str]]:
    out = {}
    for p in ps:
        t = _target(p)
        if t is not None and t[0] == "CreateQuery":
            m = _ENGINE.search(p["formatted"])
            assert m, p["formatted"][-200:]
            out[t[1]] = (m.group(1), m.group(2) or "")
    return out


def test_replicated_engines_keeper_paths_and_distributed_tables() -> None:
    single, cluster = _engines(parsed(None)), _engines(parsed(CLUSTER))
    sharded = {**schema.SHARD_BY, **sla_schema.SHARD_BY}
    for table, shard in sharded.items():
        family, args = single[table]
        local = table + layout.LOCAL_SUFFIX if shard else table
        r_family, r_args = cluster[local]
        assert r_family == "Replicated" + family, table
        path = f"/clickhouse/tables/{'{shard}' if shard else 'all'}/{DB}/{local}"
        replica = "{replica}" if shard else "{shard}-{replica}"
        assert r_args == ", ".join(x for x in (f"'{path}'", f"'{replica}'", args) if x), table
        if shard:
            assert cluster[table] == ("Distributed", f"{CLUSTER}, {DB}, {local}, {shard}")
    # what pairing reads is sharded by trace id, so a trace's rows meet on one shard
    for t in (schema.SPANS, schema.ENTRIES, schema.PAIRS, schema.SPAN_TRACES, schema.ENTRY_TRACES):
        assert schema.SHARD_BY[t] == "cityHash64(trace_id)", t
    # tables written with insert tokens deduplicate them on the replicas too
    for p in parsed(CLUSTER):
        if (
            "SETTINGS index_granularity" in p["formatted"]
            and "ReplacingMergeTree(" in p["formatted"]
        ):
            assert "replicated_deduplication_window = 1000" in p["formatted"]
            assert "non_replicated_deduplication_window" not in p["formatted"]


def test_views_read_and_write_the_local_tables() -> None:
    views = [p["formatted"] for p in parsed(CLUSTER) if "MATERIALIZED VIEW" in p["formatted"]]
    assert len(views) == 2
    for v, (target, source) in zip(
        views, (("span_traces", "server_spans"), ("entry_traces", "browser_entries")), strict=True
    ):
        assert f"TO {DB}.{target}_local" in v and f"FROM {DB}.{source}_local" in v, v
    final = [" ".join(p["formatted"].split()) for p in parsed(CLUSTER) if "pairs_final" in p["sql"]]
    assert final and f"FROM {DB}.pairs FINAL" in final[0]  # over the Distributed table


def test_ttl_and_merge_settings_go_to_the_local_tables() -> None:
    alters = [p["formatted"] for p in parsed(CLUSTER) if "MODIFY" in p["formatted"]]
    tables = {re.search(r"ALTER TABLE \w+\.(\w+)", a).group(1) for a in alters}  # type: ignore[union-attr]
    want = {layout.Layout(CLUSTER).local(t, schema.SHARD_BY[t]) for t in schema.DATA_TABLES}
    assert tables == want
    assert all(a.endswith("_local") for a in tables)
    assert sum("MODIFY TTL" in a for a in alters) == len(want)
    assert sum("MODIFY SETTING merge_selector_base = 10" in a for a in alters) == len(want)


def test_store_on_a_cluster_sends_the_cluster_settings(tmp_path: Path) -> None:
    import clickhouse_connect

    seen: list[dict[str, Any]] = []
    real = clickhouse_connect.get_client

    def fake(**kw: Any) -> object:
        seen.append(kw)
        return object()

    clickhouse_connect.get_client = fake  # type: ignore[assignment]
    try:
        Store("http://h:8123/db", cluster="c1").client()
        Store("http://h:8123/db").client()
    finally:
        clickhouse_connect.get_client = real
    assert seen[0]["settings"] == CLUSTER_SETTINGS
    assert "settings" not in seen[1]
    assert CLUSTER_SETTINGS["insert_distributed_sync"] == 1
    with pytest.raises(ValueError, match="invalid cluster name"):
        Store("http://h:8123/db", cluster="c1; DROP TABLE x")
