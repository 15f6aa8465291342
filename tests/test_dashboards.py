"""The Grafana dashboard's queries run on the real schema (chDB is the ClickHouse engine)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from collector.sla import schema as sla_schema
from collector.store.client import Store, chdb_dsn

ROOT = Path(__file__).resolve().parent.parent
DASH = ROOT / "dashboards" / "parallax-sla.json"
PROVISIONING = ROOT / "dashboards" / "provisioning"


def _grafana_to_sql(sql: str) -> str:
    """Expand the ClickHouse plugin's macros and the route variable as Grafana would."""
    sql = re.sub(r"\$__timeInterval\((\w+)\)", r"toStartOfMinute(\1)", sql)
    sql = re.sub(
        r"\$__timeFilter\((\w+)\)",
        r"\1 >= now() - INTERVAL 1 HOUR AND \1 <= now() + INTERVAL 1 MINUTE",
        sql,
    )
    return sql.replace("${route:singlequote}", "'All'")


def _queries() -> list[tuple[str, str]]:
    d = json.loads(DASH.read_text())
    out = [
        (f"panel {p['id']} {p['title']}/{t['refId']}", t["rawSql"])
        for p in d["panels"]
        for t in p["targets"]
    ]
    out += [(f"variable {v['name']}", v["query"]) for v in d["templating"]["list"]]
    return out


def test_dashboard_uses_the_provisioned_datasource() -> None:
    ds = yaml.safe_load((PROVISIONING / "datasources" / "parallax.yaml").read_text())
    uid = ds["datasources"][0]["uid"]
    d = json.loads(DASH.read_text())
    assert d["uid"] and len({p["id"] for p in d["panels"]}) == len(d["panels"])
    for p in d["panels"]:
        assert p["datasource"]["uid"] == uid
        assert p["description"], p["title"]  # every panel says what it shows
        for t in p["targets"]:
            assert t["datasource"]["uid"] == uid


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Store:
    s = Store(chdb_dsn(tmp_path_factory.mktemp("dash")))
    s.migrate(7)
    sla_schema.ensure(s.client(), s.database)
    s.client().command(
        f"INSERT INTO {s.database}.pairs (time, version, site, service, route, method, status, "
        "kind, trace_id, span_id, user_ttfb_ms, server_ttfb_ms, user_ttft_ms, server_ttft_ms, "
        "user_visible_ttft_ms, network_ms, recv_queue_ms, render_delay_ms, server_itl_ms, "
        "edge_itl_ms, user_itl_ms, hops, server_timed) "
        "SELECT now() - toIntervalSecond(number), 1, 'demo', 'chat', '/v1/chat', 'POST', 200, "
        "'fetch', lower(hex(number + 1)), lower(hex(number + 7)), 40 + number % 30, 2, 150, 120, "
        "170, 3, 35, 18, [25, 25], [25, 25], [24, 26], 1, true FROM numbers(200)"
    )
    return s


@pytest.mark.parametrize(("name", "sql"), _queries())
def test_every_query_runs_on_the_schema(store: Store, name: str, sql: str) -> None:
    rows = store.client().query(_grafana_to_sql(sql)).result_rows
    if "Alerts" not in name:
        assert rows, f"{name} returned nothing on 200 pairs"
