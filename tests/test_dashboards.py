"""The Grafana dashboard's queries run on the real schema (chDB is the ClickHouse engine)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

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


# chDB allows one embedded data path per process, and other tests in this pytest process
# hold theirs: the queries run in a child process on a store of their own.
CHECK = r"""
import json, sys
from collector.sla import schema as sla_schema
from collector.store.client import Store, chdb_dsn
s = Store(chdb_dsn(__import__("pathlib").Path(sys.argv[1])))
s.migrate(7)
sla_schema.ensure(s.client(), s.database)
s.client().command(
    f"INSERT INTO {s.database}.pairs (time, version, site, service, route, method, status, "
    "kind, trace_id, span_id, user_ttfb_ms, server_ttfb_ms, user_ttft_ms, server_ttft_ms, "
    "user_visible_ttft_ms, network_ms, recv_queue_ms, render_delay_ms, server_itl_ms, "
    "edge_itl_ms, user_itl_ms, hops, server_timed, sample_th) "
    "SELECT now() - toIntervalSecond(number), 1, 'demo', 'chat', '/v1/chat', 'POST', 200, "
    "'fetch', lower(hex(number + 1)), lower(hex(number + 7)), 40 + number % 30, 2, 150, 120, "
    "170, 3, 35, 18, [25, 25], [25, 25], [24, 26], 1, true, "
    # half the pairs sampled at p = 1/4 (threshold 3/4 of 2^56): the weighted quantiles
    "if(number % 2, 54043195528445952, 0) FROM numbers(200)")
# the agent's counts: one port, an export every 10 s for 10 minutes
s.client().command(
    f"INSERT INTO {s.database}.request_counts (time, start_time, host, service, port, metric, "
    "value, temporality) SELECT now() - toIntervalSecond(10 * (60 - number)), "
    "now() - toIntervalSecond(700), 'n1', 'chat', 8000, m.1, m.2 * number, 'cumulative' "
    "FROM numbers(60) ARRAY JOIN [('parallax.requests.seen', 40), "
    "('parallax.requests.traced', 10)] AS m")
out = {}
for name, sql in json.load(sys.stdin):
    try:
        out[name] = len(s.client().query(sql).result_rows)
    except Exception as e:  # reported per query by the test
        out[name] = str(e).splitlines()[0]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, int | str]:
    queries = [(name, _grafana_to_sql(sql)) for name, sql in _queries()]
    p = subprocess.run(
        [sys.executable, "-c", CHECK, str(tmp_path_factory.mktemp("dash") / "chdb")],
        input=json.dumps(queries),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert p.returncode == 0, p.stderr[-2000:]
    out: dict[str, int | str] = json.loads(p.stdout.strip().splitlines()[-1])
    return out


@pytest.mark.parametrize(("name", "sql"), _queries())
def test_every_query_runs_on_the_schema(results: dict[str, int | str], name: str, sql: str) -> None:
    got = results[name]
    assert isinstance(got, int), f"{name}: {got}\n{sql}"
    if "Alerts" not in name:
        assert got > 0, f"{name} returned nothing on 200 pairs"


# --- the health dashboard (Prometheus): agent, collector and SLA checker metrics ------------
HEALTH = ROOT / "dashboards" / "parallax-health.json"


def _exposed() -> dict[str, set[str]]:
    """Sample name → label names, from the real metric registries of the three parts."""
    from prometheus_client import CollectorRegistry

    from agent.metrics import Metrics as AgentMetrics
    from collector.metrics import Metrics as CollectorMetrics
    from collector.sla.metrics import SlaMetrics

    regs: list[CollectorRegistry] = [AgentMetrics().registry]
    c = CollectorMetrics()
    SlaMetrics(c.registry)
    regs.append(c.registry)
    out: dict[str, set[str]] = {}
    suffixes = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_sum", "_count")}
    for reg in regs:
        for collector, names in reg._collector_to_names.items():  # no public API lists label names
            labels = set(getattr(collector, "_labelnames", ()))
            for n in names:
                out[n] = labels | ({"le"} if n.endswith("_bucket") else set())
        # custom collectors (the agent's per-port request counts) name theirs when collected
        for fam in reg.collect():
            labels = set(getattr(fam, "_labelnames", ()))
            for n in (fam.name, *(fam.name + x for x in suffixes.get(fam.type, ()))):
                out.setdefault(n, labels | ({"le"} if n.endswith("_bucket") else set()))
    return out


def _health_targets() -> list[tuple[str, str, str]]:
    d = json.loads(HEALTH.read_text())
    return [
        (f"panel {p['id']} {p['title']}/{t['refId']}", t["expr"], t.get("legendFormat", ""))
        for p in d["panels"]
        if p["type"] != "row"
        for t in p["targets"]
    ]


def test_health_dashboard_uses_the_provisioned_prometheus() -> None:
    ds = yaml.safe_load((PROVISIONING / "datasources" / "parallax.yaml").read_text())
    uid = next(x["uid"] for x in ds["datasources"] if x["type"] == "prometheus")
    d = json.loads(HEALTH.read_text())
    assert len({p["id"] for p in d["panels"]}) == len(d["panels"])
    for p in d["panels"]:
        if p["type"] == "row":
            continue
        assert p["description"], p["title"]
        assert p["datasource"]["uid"] == uid
        assert all(t["datasource"]["uid"] == uid for t in p["targets"])


@pytest.mark.parametrize(("name", "expr", "legend"), _health_targets())
def test_health_query_parses_and_names_real_metrics(name: str, expr: str, legend: str) -> None:
    """The PromQL parses, every metric it reads is exported by the agent, the collector or
    the SLA checker, and every label it groups by or shows in the legend exists on them."""
    import promql_parser

    promql_parser.parse(expr.replace("$__rate_interval", "5m"))
    exposed = _exposed()
    metrics = re.findall(r"\bparallax_[a-z0-9_]+", expr)
    assert metrics, name
    labels: set[str] = {"instance", "job"}  # added by the scrape
    for m in metrics:
        assert m in exposed, f"{name}: {m} is not exported (have: {sorted(exposed)})"
        labels |= exposed[m]
    for group in re.findall(r"\bby \(([^)]*)\)", expr):
        for lb in (x.strip() for x in group.split(",")):
            assert lb in labels, f"{name}: grouped by {lb}, not a label of {metrics}"
    for lb in re.findall(r"\{\{(\w+)\}\}", legend):
        assert lb in labels, f"{name}: legend shows {lb}"
