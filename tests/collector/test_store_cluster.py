"""The cluster layout run for real where it can be (tests/collector/cluster_scenario.py: chDB
with a ``<remote_servers>`` cluster whose shard is the process itself, the Keeper-only parts
of each statement replaced — see its docstring): migrations applied once and then none, the
same columns as on one server in every local and Distributed table, insert tokens that reach
the shard's table through the Distributed one, pairing across "collectors" through the store
(the recheck), the sweep, the coverage, the SLA checker's summaries and verdicts — all equal
to the same scenario on a one-server store; and on a two-shard cluster, the collector's
subqueries over Distributed tables refused without the cluster settings and run with them.
Then ``serve --cluster`` refusing what it cannot serve."""

from __future__ import annotations

import json
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from collector.sla import schema as sla_schema
from collector.store import schema
from tests.collector import cluster_scenario
from tests.collector.helpers import BIN

ROOT = Path(__file__).resolve().parents[2]


@cache
def _run(tmp: Path) -> dict[str, Any]:
    cfg = tmp / "config.xml"
    cfg.write_text(cluster_scenario.CONFIG)
    p = subprocess.run(
        [sys.executable, "-m", "tests.collector.cluster_scenario", str(cfg), str(tmp / "chdb")],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    out: dict[str, Any] = json.loads(p.stdout.strip().splitlines()[-1])
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _run(tmp_path_factory.mktemp("cluster"))


def test_migrations_apply_once_on_a_cluster(run: dict[str, Any]) -> None:
    versions = [v for v, _what, _sql in schema.migrations("parallax", 7)]
    assert versions[:5] == [1, 2, 3, 4, 5]  # (and every later one)
    assert run["applied"] == {db: versions for db in ("parallax", "pxc", "px2")}
    assert run["again"] == {db: [] for db in ("parallax", "pxc", "px2")}
    assert run["rewritten"] > 40  # every cluster DDL statement went through the rewrite


def test_every_table_has_the_one_server_columns(run: dict[str, Any]) -> None:
    c = run["columns"]
    shard_by = {**schema.SHARD_BY, **sla_schema.SHARD_BY}
    sharded = sorted(t for t, k in shard_by.items() if k)
    assert c["local"] == c["distributed"] == sharded
    assert set(c["whole"]) == {t for t, k in shard_by.items() if not k} | {"pairs_final"}
    assert set(c["tables"]) == set(c["local"]) | set(c["whole"])
    assert c["local_differ"] == c["distributed_differ"] == c["whole_differ"] == []


def test_pairing_through_the_store_is_the_same_on_a_cluster(run: dict[str, Any]) -> None:
    one, cl = run["pairing"]["parallax"], run["pairing"]["pxc"]
    # 300 traces: 100 whose spans came only through the store, 100 whose spans came after the
    # first look (found at the recheck), 100 whose entries came through another collector
    assert len(cl["pairs"]) == cl["view"] == 300
    assert cl["spans"] == 300  # the replayed segment's token reached the shard's table
    assert cl["span_traces"] >= 300
    assert cl["swept"] == 50  # the entries whose spans never came
    assert cl["coverage"] == [[["/api/chat", 300.0, 300.0]], [["/api/chat", 350, 300, 0]]]
    assert cl == one


def test_the_sla_checker_is_the_same_on_a_cluster(run: dict[str, Any]) -> None:
    one, cl = run["sla"]["parallax"], run["sla"]["pxc"]
    verdicts = {r["route"]: r["metrics"]["ttfb"]["verdict"] for r in cl["routes"]}
    assert verdicts == {"/v1/net": "out_of_band", "/v1/ok": "ok"}
    assert cl["minutes"] > 0
    assert cl == one


def test_subqueries_over_distributed_tables_need_the_cluster_settings(
    run: dict[str, Any],
) -> None:
    two = run["two_shards"]
    for what in ("sweep", "coverage"):
        assert "Code: 288" in str(two["no_settings"][what]), two  # DISTRIBUTED_IN_JOIN_…_DENIED
    assert two["cluster_settings"] == {"sweep": 0, "coverage": 1}


def _serve(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> str:
    p = subprocess.run(
        [str(BIN), "serve", "--data-dir", str(tmp_path / "d"), "--no-plugins", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert p.returncode == 2, p.stderr[-1500:]
    return p.stderr.strip().splitlines()[-1]


def test_serve_refuses_a_cluster_it_cannot_serve(tmp_path: Path) -> None:
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("PARALLAX_STORE")}
    line = _serve(tmp_path, "--cluster", "c1", env=env)
    assert "--cluster c1: a cluster is a ClickHouse server store" in line
    line = _serve(tmp_path, "--cluster", "c-1", "--store", "http://h:8123/db", env=env)
    assert "invalid cluster name 'c-1'" in line
    line = _serve(tmp_path, env={**env, "PARALLAX_STORE_CLUSTER": "c1"})
    assert "--cluster c1: a cluster is a ClickHouse server store" in line


def test_the_pairing_interval_is_a_positive_flag() -> None:
    """--pairing-interval: the lever on the store look-ups' CPU (docs/store.md, capacity)."""
    from collector import cli

    assert cli._parser().parse_args(["serve", "--pairing-interval", "2"]).pairing_interval == 2.0
    for bad in ("0", "-1"):
        with pytest.raises(SystemExit):
            cli._parser().parse_args(["serve", "--pairing-interval", bad])
