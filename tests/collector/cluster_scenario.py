"""The cluster layout executed on chDB (run by tests/collector/test_store_cluster.py in a child
process: one chDB per process). ``python -m tests.collector.cluster_scenario CONFIG PATH``
prints one JSON line.

chDB reads a server configuration (``config-file``) with a ``<remote_servers>`` cluster whose
one shard is this process (``127.0.0.1`` on the configured ``tcp_port``: a Distributed table
reads and writes it locally, no network) and ``<macros>``; so the Distributed tables of the
cluster DDL run for real. What cannot run without ZooKeeper/Keeper is replaced in each
statement, and only that (``keeperless``): ``Replicated<X>MergeTree('<path>', '<replica>'[,
args])`` → ``<X>MergeTree([args])``, ``ON CLUSTER <name>`` dropped (the distributed DDL queue
lives in Keeper), the replicated insert-deduplication window → the non-replicated one (the
same count). The statements as generated are what test_store_cluster_ddl.py parses.

Three databases in one store: ``parallax`` migrated as one server, ``pxc`` as the cluster
``one``, ``px2`` as the cluster ``two`` — two shards, the second unreachable (127.0.0.2) and
skipped (``skip_unavailable_shards``): with one shard ClickHouse never checks a subquery over
a Distributed table, with two it does.
"""

from __future__ import annotations

import json
import re
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from functools import cache
from typing import Any

import clickhouse_connect

CONFIG = """<clickhouse>
  <tcp_port>9000</tcp_port>
  <macros><shard>01</shard><replica>r1</replica></macros>
  <remote_servers>
    <one>
      <shard><internal_replication>true</internal_replication>
        <replica><host>127.0.0.1</host><port>9000</port></replica></shard>
    </one>
    <two>
      <shard><internal_replication>true</internal_replication>
        <replica><host>127.0.0.1</host><port>9000</port></replica></shard>
      <shard><internal_replication>true</internal_replication>
        <replica><host>127.0.0.2</host><port>9000</port></replica></shard>
    </two>
  </remote_servers>
</clickhouse>
"""

_REPLICATED = re.compile(r"Replicated(\w*MergeTree)\('[^']*', '[^']*'(?:, )?")
_REPLICATED_DEDUP = re.compile(
    r"replicated_deduplication_window = (\d+), replicated_deduplication_window_seconds = \d+"
)
REWRITTEN: list[str] = []


def keeperless(sql: str) -> str:
    out = _REPLICATED.sub(lambda m: m.group(1) + "(", sql).replace("MergeTree()", "MergeTree")
    out = re.sub(r" ON CLUSTER \w+", "", out)
    out = _REPLICATED_DEDUP.sub(r"non_replicated_deduplication_window = \1", out)
    if out != sql:
        REWRITTEN.append(sql)
    return out


class _KeeperLess:
    """A client whose DDL is rewritten by ``keeperless``; all else goes to the real one."""

    def __init__(self, client: Any) -> None:
        self._c = client

    def command(self, cmd: str, *a: Any, **kw: Any) -> Any:
        return self._c.command(keeperless(cmd), *a, **kw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._c, name)


def main(config: str, path: str) -> dict[str, Any]:
    real = clickhouse_connect.get_client

    def get_client(**kw: Any) -> Any:
        return real(chdb_options={"config-file": config}, **kw)

    clickhouse_connect.get_client = get_client

    from collector.store.client import Store

    class ClusterStore(Store):
        def __init__(self, db: str, cluster: str | None, **extra: Any) -> None:
            super().__init__(f"chdb://{path}", cluster=cluster)
            self.database, self._extra = db, extra

        def client(self) -> Any:
            c = super().client()
            for k, v in self._extra.items():
                c.set_client_setting(k, v)
            return _KeeperLess(c) if self.cluster else c

    single = ClusterStore("parallax", None)
    cluster = ClusterStore("pxc", "one")
    two = ClusterStore("px2", "two", skip_unavailable_shards=1)
    out: dict[str, Any] = {}
    for st in (single, cluster, two):
        out.setdefault("applied", {})[st.database] = st.migrate(7)
        out.setdefault("again", {})[st.database] = st.migrate(7)
    out["rewritten"] = len(REWRITTEN)
    out["columns"] = columns(single, cluster)
    out["pairing"] = {st.database: pairing(st) for st in (single, cluster)}
    # one instant for both stores: pairs generated at two different "now"s may straddle a
    # minute boundary and fill a different number of minute rows (135 vs 112, once)
    now = datetime.now(UTC).replace(microsecond=0)
    out["sla"] = {st.database: sla(st, now) for st in (single, cluster)}
    out["two_shards"] = two_shards(two, ClusterStore("px2", None, skip_unavailable_shards=1))
    return out


def columns(single: Any, cluster: Any) -> dict[str, Any]:
    """Every table's columns as the server made them: the cluster's local tables and its
    Distributed tables against the one server's tables of the same name."""
    from collector.sla.source import SlaSource

    for st in (single, cluster):
        SlaSource(st.client, st.database, cluster=st.cluster).ensure_schema()

    def cols(st: Any) -> dict[str, list[Any]]:
        by: dict[str, list[Any]] = {}
        for t, *rest in st.query(
            "SELECT table, name, type, default_kind, default_expression, compression_codec "
            "FROM system.columns WHERE database = {db:String} AND table NOT LIKE '%\\_mv' "
            "ORDER BY table, position",
            {"db": st.database},
        ).result_rows:
            by.setdefault(t, []).append(rest)
        return by

    engines = dict(
        cluster.query(
            "SELECT name, engine FROM system.tables WHERE database = {db:String}",
            {"db": cluster.database},
        ).result_rows
    )
    a, b = cols(single), cols(cluster)
    local = {t.removesuffix("_local"): v for t, v in b.items() if t.endswith("_local")}
    dist = {t: v for t, v in b.items() if engines.get(t) == "Distributed"}
    whole = {t: v for t, v in b.items() if t not in dist and not t.endswith("_local")}
    return {
        "tables": sorted(a),
        "local": sorted(local),
        "distributed": sorted(dist),
        "whole": sorted(whole),
        "local_differ": sorted(t for t in local if local[t] != a.get(t)),
        # the Distributed table's columns as declared (its codecs are the local table's)
        "distributed_differ": sorted(
            t for t in dist if [c[:3] for c in dist[t]] != [c[:3] for c in a.get(t, [])]
        ),
        "whole_differ": sorted(t for t in whole if whole[t] != a.get(t)),
    }


def _rows(n: int, seed: int) -> tuple[list[Any], list[Any]]:
    """Span rows and entry rows of ``n`` traces (one each) as the collector's parsers make
    them, from the benchmark's generated bodies."""
    from bench.collector import _bodies
    from collector.ingest import beacons, otlp

    spans, bcs = _bodies(n, seed)
    now = time.time_ns()
    sr = [r for b in spans for r in otlp.parse(b, False, now, 0, now).rows]
    er = [r for b in bcs for r in beacons.parse(beacons.read(b), now, 0, now).rows]
    return sr, er


@cache
def _traces() -> tuple[tuple[list[Any], list[Any]], list[Any]]:
    """The same rows for every store: 300 traces, and 50 entries whose spans never come."""
    return _rows(300, 1), _rows(50, 2)[1]


def pairing(st: Any) -> dict[str, Any]:
    """A trace's two sides arriving through different collectors, as the pairer sees it on
    a server store: what it wrote itself is in memory, the rest only in the store."""
    from collector.metrics import Metrics
    from collector.pairing import coverage
    from collector.pairing.pairer import PAIR_NAMES, Pairer
    from collector.store import schema

    sn, en = schema.column_names(schema.SPAN_COLUMNS), schema.column_names(schema.ENTRY_COLUMNS)
    (sr, er), lonely = _traces()
    pa = Pairer(st, Metrics(), lookback_s=3600, recheck_s=0.3, exclusive=False)

    def rounds(seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            if b := pa._take_due():
                pa.pair_round(b)
            else:
                time.sleep(0.02)

    def put(table: str, rows: list[Any], names: list[str], segment: int) -> None:
        st.insert_rows(table, rows, names, token=f"{segment}:{table}")  # the writer's token

    a, b, c = slice(0, 100), slice(100, 200), slice(200, 300)
    # A: spans written by another collector (twice: a replayed segment), entries here.
    put(schema.SPANS, sr[a], sn, 1)
    put(schema.SPANS, sr[a], sn, 1)
    put(schema.ENTRIES, er[a], en, 2)
    pa.offer([], er[a])
    # B: entries here first; their spans reach the store through another collector after
    # this collector's first look (found at its recheck).
    put(schema.ENTRIES, er[b], en, 3)
    pa.offer([], er[b])
    rounds(0.15)
    put(schema.SPANS, sr[b], sn, 4)
    # C: spans here; the entries through another collector before this one looks (recheck).
    put(schema.SPANS, sr[c], sn, 5)
    pa.offer(sr[c], [])
    put(schema.ENTRIES, er[c], en, 6)
    # and entries whose spans never come
    put(schema.ENTRIES, lonely, en, 7)
    rounds(1.0)
    db = st.database
    pairs = st.query(
        f"SELECT {', '.join(PAIR_NAMES)} FROM {db}.pairs FINAL ORDER BY trace_id, span_id"
    )
    skip = {PAIR_NAMES.index("version"), PAIR_NAMES.index("paired_at")}
    return {
        "spans": st.query(f"SELECT count() FROM {db}.server_spans").result_rows[0][0],
        "span_traces": st.query(f"SELECT count() FROM {db}.span_traces").result_rows[0][0],
        "pairs": [[v for i, v in enumerate(r) if i not in skip] for r in pairs.result_rows],
        "store_lookups": pa.store_lookups,
        "swept": pa.sweep(),
        "coverage": [list(x) for x in coverage.compute(st)[:2]],
        "view": st.query(f"SELECT count() FROM {db}.pairs_final").result_rows[0][0],
    }


def sla(st: Any, now: datetime) -> dict[str, Any]:
    """The SLA checker over generated pairs: its summaries written, its evaluation read."""
    from collector.sla.config import SlaConfig
    from collector.sla.evaluate import evaluate
    from collector.sla.source import SlaSource
    from tests.sla import scenario

    data = {k: v for k, v in scenario.build(now=now, spread_s=200).items() if k in SLA_ROUTES}
    scenario.write(st.client(), st.database, data, paired_at=now)
    src = SlaSource(st.client, st.database, cluster=st.cluster)
    doc = evaluate(src, SlaConfig(), now, timedelta(minutes=5)).to_json()
    db = st.database
    return {
        "routes": [r for r in doc["routes"] if r["route"] in SLA_ROUTES],
        "minutes": st.query(f"SELECT count() FROM {db}.sla_minutes FINAL").result_rows[0][0],
    }


SLA_ROUTES = ("/v1/ok", "/v1/net")


def two_shards(st: Any, plain: Any) -> dict[str, Any]:
    """The collector's queries that hold a subquery over a Distributed table, on a two-shard
    cluster: with the cluster settings, and with none."""
    from collector.metrics import Metrics
    from collector.pairing import coverage
    from collector.pairing.pairer import Pairer

    out: dict[str, Any] = {}
    for name, store in (("cluster_settings", st), ("no_settings", plain)):
        res: dict[str, Any] = {}
        calls: dict[str, Callable[[Any], int]] = {
            "sweep": lambda s: Pairer(s, Metrics(), exclusive=False).sweep(),
            "coverage": lambda s: coverage.compute(s)[2],
        }
        for what, fn in calls.items():
            try:
                res[what] = fn(store)
            except Exception as e:  # noqa: BLE001 — the error is the result
                res[what] = str(e).splitlines()[0][:160]
        out[name] = res
    return out


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2]), default=str))
