"""The Grafana dashboards: built from code, valid for the dashboard schema the SDK carries, and
every ClickHouse panel's SQL — expanded as Grafana and the ClickHouse plugin expand it
(tests/grafana_interp.py) — run on the real schema in chDB, filled with a generated scenario
(tests/dashboards_scenario.py) whose truth the assertions compute on their own. The health
dashboard's PromQL is parsed and checked against the real metric registries."""

from __future__ import annotations

import copy
import json
import re
import subprocess
import sys
from collections import defaultdict
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

import jsonschema
import numpy as np
import pytest
import yaml

from collector.sla import alerts as sla_alerts
from collector.sla import notify, sampling
from collector.sla.evaluate import MetricResult
from dashboards.build import GENERATED, render_all
from parallax_contracts import agent_metrics as gm
from tests import dashboards_scenario as scen
from tests import prom_tools
from tests.grafana_interp import ALL, Query, Variable, interpolate

ROOT = Path(__file__).resolve().parent.parent
DIR = ROOT / "dashboards"
PROVISIONING = DIR / "provisioning"
SCHEMAS = Path(__file__).resolve().parent / "grafana_schema"
FILES = sorted(p.name for p in DIR.glob("*.json"))
CLICKHOUSE = sorted(GENERATED)


def load(name: str) -> dict[str, Any]:
    out: dict[str, Any] = json.loads((DIR / name).read_text())
    return out


# --- built from code ---------------------------------------------------------------------
def test_committed_dashboards_are_what_the_code_builds() -> None:
    built = render_all()
    assert sorted(built) == CLICKHOUSE and set(CLICKHOUSE) < set(FILES)
    for name, text in built.items():
        assert (DIR / name).read_text() == text, f"{name}: run `python -m dashboards`"


# --- the SDK's schema --------------------------------------------------------------------
def _schema(name: str) -> dict[str, Any]:
    out: dict[str, Any] = json.loads((SCHEMAS / f"{name}.jsonschema.json").read_text())
    return out


def _dashboard_validator() -> jsonschema.Draft7Validator:
    s = _schema("dashboard")
    # The CUE source types a matcher's options and an override's value as `_` (any value);
    # the JSON Schema export renders that as an object, which the SDK's own override_by_name
    # (a field name: a string) already breaks. Only these two are widened, to any value.
    defs = s["definitions"]
    defs["MatcherConfig"]["properties"]["options"] = {}
    defs["DynamicConfigValue"]["properties"]["value"] = {}
    return jsonschema.Draft7Validator(s)


def schema_errors(d: dict[str, Any]) -> list[str]:
    errors = [  # a panel is one of Panel or RowPanel: the reasons are in the context
        f"{list(e.absolute_path)}: "
        + "; ".join(c.message[:200] for c in (e.context or [e]) if not c.message.startswith("{"))
        for e in _dashboard_validator().iter_errors(d)
    ]
    for p in d["panels"]:
        f = SCHEMAS / f"{p['type']}.jsonschema.json"
        if p["type"] == "row" or not f.exists():
            continue
        defs = _schema(p["type"])["definitions"]
        custom = p.get("fieldConfig", {}).get("defaults", {}).get("custom")
        for part, value in (("Options", p.get("options")), ("FieldConfig", custom)):
            if value is None:
                continue
            v = jsonschema.Draft7Validator({"$ref": f"#/definitions/{part}", "definitions": defs})
            errors += [f"panel {p['id']} {part}: {e.message[:200]}" for e in v.iter_errors(value)]
    return errors


@pytest.mark.parametrize("name", FILES)
def test_dashboard_matches_the_sdk_schema(name: str) -> None:
    d = load(name)
    assert schema_errors(d) == []
    # the check bites: a misspelt panel key, a wrong option type
    bad = copy.deepcopy(d)
    panel = next(p for p in bad["panels"] if p["type"] == "timeseries")
    panel["titel"] = panel.pop("title")
    panel["options"]["legend"]["showLegend"] = "yes"
    errs = schema_errors(bad)
    assert any("titel" in e for e in errs) and any("'yes'" in e for e in errs), errs


@pytest.mark.parametrize("name", CLICKHOUSE)
def test_panels_use_the_provisioned_datasource_and_say_what_they_show(name: str) -> None:
    ds = yaml.safe_load((PROVISIONING / "datasources" / "parallax.yaml").read_text())
    uid = next(x["uid"] for x in ds["datasources"] if x["type"] == "grafana-clickhouse-datasource")
    d = load(name)
    assert d["uid"] and len({p["id"] for p in d["panels"]}) == len(d["panels"])
    for p in d["panels"]:
        if p["type"] == "row":
            continue
        assert p["description"], p["title"]  # every panel says what it shows
        for t in p.get("targets", []):
            assert t["datasource"]["uid"] == uid == p["datasource"]["uid"]
            assert "${" not in re.sub(r"\$\{\w+:singlequote\}", "", t["rawSql"]), (
                f"{p['title']}: a variable not quoted by Grafana"
            )


# --- the three clicks: alert → route → request --------------------------------------------
def _vars(name: str) -> set[str]:
    return {v["name"] for v in load(name)["templating"]["list"]}


def _links(name: str) -> list[str]:
    return [
        link["url"]
        for p in load(name)["panels"]
        for link in p.get("fieldConfig", {}).get("defaults", {}).get("links", [])
    ]


def _link_vars(url: str) -> set[str]:
    return {k.removeprefix("var-") for k in re.findall(r"[?&](var-\w+)=", url)}


def test_the_alert_link_opens_the_route_dashboard_on_its_route_metric_band_and_time() -> None:
    route = load("parallax-route.json")
    assert route["uid"] == notify.ROUTE_DASHBOARD_UID
    assert set(notify.LINK_VARS) == _vars("parallax-route.json")
    m = MetricResult(
        "llm", "/v1/chat", "ttft", "out_of_band", "critical", 400, 25.0, 100, 31.0, 22.0, 40.0,
        {"p95": 500.0}, {"p95": 469.0}, {}, [], [], "…",
    )  # fmt: skip
    fired = datetime(2026, 11, 29, 10, 0, tzinfo=UTC)
    st = sla_alerts.AlertState(
        ("llm", "/v1/chat", "ttft"), "firing", fired, True, fired, "critical", last=m
    )
    now = fired + timedelta(minutes=3)
    obj = notify.alert_object(st, now, 60, grafana_url="https://g.example/grafana")
    url = urlparse(obj["annotations"]["dashboard"])
    assert obj["generatorURL"] == obj["annotations"]["dashboard"]
    assert (url.scheme, url.netloc, url.path) == ("https", "g.example", "/grafana/d/parallax-route")
    q = {k: v[0] for k, v in parse_qs(url.query).items()}
    assert q == {
        "from": str(int((fired - timedelta(hours=1)).timestamp() * 1000)),
        "to": "now",
        "var-service": "llm",
        "var-route": "/v1/chat",
        "var-metric": "ttft",
        "var-band": "25",
    }
    assert {k.removeprefix("var-") for k in q if k.startswith("var-")} == _vars(
        "parallax-route.json"
    )
    st.state = "resolved"
    q = parse_qs(urlparse(notify.alert_object(st, now, 60, "", "https://g")["annotations"][
        "dashboard"]).query)  # fmt: skip
    assert q["to"] == [str(int((now + timedelta(minutes=10)).timestamp() * 1000))]
    # no Grafana configured: no link, no generatorURL
    plain = notify.alert_object(st, now, 60)
    assert "dashboard" not in plain["annotations"] and "generatorURL" not in plain


def test_panel_links_go_to_the_next_dashboard_with_its_variables() -> None:
    (alerts_link, route_link) = _links("parallax-sla.json")
    for link in (alerts_link, route_link):
        assert link.startswith(f"/d/{notify.ROUTE_DASHBOARD_UID}?")
        assert _link_vars(link) <= _vars("parallax-route.json")
    assert _link_vars(alerts_link) == {"service", "route", "metric", "band"}
    (request_link,) = _links("parallax-route.json")
    assert request_link.startswith("/d/parallax-request?")
    assert _link_vars(request_link) == _vars("parallax-request.json") == {"trace_id"}


# --- every panel's SQL in chDB, on the scenario ------------------------------------------
ANCHOR = scen.anchor_now()
SC = scen.build(ANCHOR)
RANGE = Query(ANCHOR - timedelta(minutes=5), ANCHOR + timedelta(minutes=25), 60)
MIN = 60_000  # ms
LLM = [Variable("service", "llm"), Variable("route", "/v1/chat"), Variable("band", "15")]
EDGE = next(r for r in SC.requests if len(r.hops) == 2 and r.session in scen.FILTERED_THETA)
DIRECT = next(r for r in SC.requests if r.service == "llm" and r.session in scen.DRIFT)
VARIANTS: dict[str, tuple[str, list[Variable]]] = {
    "sla-all": ("parallax-sla.json", [Variable("route", ALL, ("/api/cart", "/v1/chat"))]),
    "sla-chat": ("parallax-sla.json", [Variable("route", ["/v1/chat"])]),
    **{
        f"route-{m}": ("parallax-route.json", [*LLM, Variable("metric", m)])
        for m in ("ttft", "itl", "duration")
    },
    "route-ttfb-25": (
        "parallax-route.json",
        [*LLM[:2], Variable("metric", "ttfb"), Variable("band", "25")],
    ),
    "route-shop": (
        "parallax-route.json",
        [
            Variable("service", "shop"),
            Variable("route", "/api/cart"),
            Variable("metric", "ttfb"),
            Variable("band", "15"),
        ],
    ),
    "request-edge": ("parallax-request.json", [Variable("trace_id", EDGE.trace_id)]),
    "request-direct": ("parallax-request.json", [Variable("trace_id", DIRECT.trace_id.upper())]),
}
# The filter the SLA dashboard had before: a custom all value ('All'), which Grafana leaves
# unformatted — what it sent to ClickHouse when "All" was selected, the default.
LEGACY = "SELECT count() FROM parallax.pairs WHERE 'All' IN (${route:singlequote})"


def _interval_s(panel: dict[str, Any]) -> float:
    """The query interval: the range's, raised to the panel's minimum interval."""
    m = re.fullmatch(r"(\d+)([sm])", panel.get("interval") or "0s")
    assert m, panel.get("interval")
    return max(RANGE.interval_s, int(m.group(1)) * (60 if m.group(2) == "m" else 1))


def _queries() -> dict[str, str]:
    out = {}
    for variant, (name, variables) in VARIANTS.items():
        d = load(name)
        for v in d["templating"]["list"]:
            if v["type"] == "query":
                out[f"{variant}/var/{v['name']}"] = interpolate(v["query"], variables, RANGE)
        for p in d["panels"]:
            q = Query(RANGE.start, RANGE.end, _interval_s(p))
            for t in p.get("targets", []):
                out[f"{variant}/{p['id']}/{t['refId']}"] = interpolate(t["rawSql"], variables, q)
    legacy_all = Variable("route", ALL, ("/v1/chat",), all_value="All")
    out["legacy/custom-all"] = interpolate(LEGACY, [legacy_all], RANGE)
    return out


QUERIES = _queries()
# Panels with nothing to show in the scenario, and why.
EMPTY = {
    # the shop route's spans carry no GPU attributes: absent, not zero
    *(f"route-shop/{p}/A" for p in (16, 17, 18)),
    # nor stream: no first token, no gaps between tokens
    *(f"route-shop/{p}/A" for p in (9, 10, 11)),
    # and the scenario's agent counts only the llm port
    *(f"route-shop/{p}/A" for p in (13, 14)),
}


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    p = subprocess.run(
        [sys.executable, "-m", "tests.dashboards_store", str(tmp_path_factory.mktemp("d") / "c"),
         str(ANCHOR.timestamp())],
        input=json.dumps(list(QUERIES.items())),
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    out: dict[str, Any] = json.loads(p.stdout.strip().splitlines()[-1])
    return out


def rows(results: dict[str, Any], name: str) -> list[dict[str, Any]]:
    r = results[name]
    assert isinstance(r, dict), f"{name}: {r}\n{QUERIES[name]}"
    return [dict(zip(r["columns"], row, strict=True)) for row in r["rows"]]


@pytest.mark.parametrize("name", sorted(set(QUERIES) - {"legacy/custom-all"}))
def test_every_query_runs_on_the_schema(results: dict[str, Any], name: str) -> None:
    got = rows(results, name)
    assert (len(got) == 0) == (name in EMPTY), f"{name}: {len(got)} rows\n{QUERIES[name]}"


def test_the_old_custom_all_value_reached_clickhouse_unquoted(results: dict[str, Any]) -> None:
    assert "'All' IN (All)" in QUERIES["legacy/custom-all"]
    err = results["legacy/custom-all"]
    assert isinstance(err, str) and "All" in err  # an unknown identifier: the panel failed


# --- the oracle: the scenario's pairs, weighted as ClickHouse does -----------------------
def wq(values: Iterable[float], weights: Iterable[float], level: float = 0.95) -> float:
    """quantileExactWeighted: sorted by value, the first whose cumulative weight reaches
    ceil(level · Σw); weights in 1/65536 units, rounded, as the panels pass them."""
    vw = sorted(zip(values, (round(65536 * w) for w in weights), strict=True))
    need = np.ceil(level * sum(w for _, w in vw))
    acc = 0
    for v, w in vw:
        acc += w
        if acc >= need:
            return float(v)
    raise AssertionError("no values")


def adj(p: dict[str, Any]) -> float:
    return 1.0 / sampling_probability(int(p["sample_th"]))


def sampling_probability(th: int) -> float:
    return 1.0 - th / 2**56


def minute(t_us: int) -> float:
    return float(t_us // 60_000_000 * 60_000)


def pairs_of(route: str) -> list[dict[str, Any]]:
    return [p for p in SC.pairs() if p["route"] == route]


def by_minute(ps: list[dict[str, Any]]) -> dict[float, list[dict[str, Any]]]:
    out: dict[float, list[dict[str, Any]]] = defaultdict(list)
    for p in ps:
        out[minute(p["time"])].append(p)
    return out


def close(a: float | None, b: float | None, tol: float = 1e-6) -> bool:
    return a is not None and b is not None and abs(a - b) <= tol * max(1.0, abs(b))


METRIC_SIDES: dict[str, tuple[Callable[[dict[str, Any]], Any], Callable[[dict[str, Any]], Any]]] = {
    "ttft": (lambda p: p["user_ttft_ms"], lambda p: p["server_ttft_ms"]),
    "ttfb": (lambda p: p["user_ttfb_ms"], lambda p: p["server_ttfb_ms"]),
    "duration": (lambda p: p["user_duration_ms"], lambda p: p["server_duration_ms"]),
    # per request, the P95 of its gaps (ClickHouse's quantileExact: element int(0.95·n))
    "itl": (
        lambda p: sorted(p["user_itl_ms"])[int(0.95 * len(p["user_itl_ms"]))]
        if p["user_itl_ms"] and p["server_itl_ms"] else None,
        lambda p: sorted(p["server_itl_ms"])[int(0.95 * len(p["server_itl_ms"]))]
        if p["user_itl_ms"] and p["server_itl_ms"] else None,
    ),
}  # fmt: skip


def measured(metric: str, ps: list[dict[str, Any]]) -> list[tuple[float, float, float]]:
    """(user, server, adjusted count) of the pairs where both sides are measured."""
    u, s = METRIC_SIDES[metric]
    return [(u(p), s(p), adj(p)) for p in ps if u(p) is not None and s(p) is not None]


@pytest.mark.parametrize(("variant", "metric", "band"), [
    ("route-ttft", "ttft", 15.0), ("route-ttfb-25", "ttfb", 25.0), ("route-itl", "itl", 15.0),
    ("route-duration", "duration", 15.0),
])  # fmt: skip
def test_route_p95_user_vs_server_with_the_band(
    results: dict[str, Any], variant: str, metric: str, band: float
) -> None:
    got = {r["t"]: r for r in rows(results, f"{variant}/2/A")}
    want = by_minute(pairs_of("/v1/chat"))
    assert sorted(got) == sorted(want)
    for t, ps in want.items():
        m = measured(metric, ps)
        u = wq([x[0] for x in m], [x[2] for x in m])
        s = wq([x[1] for x in m], [x[2] for x in m])
        r = got[t]
        assert close(r["user_p95_ms"], u) and close(r["server_p95_ms"], s), (t, r, u, s)
        assert close(r["band_low_ms"], s - band) and close(r["band_high_ms"], s + band)
    # minute 10 mixes calm pairs (weight 1) and sampled ones (weight 4): weighting moves it
    m = measured(metric, want[ANCHOR.timestamp() * 1000 + 10 * MIN])
    assert {x[2] for x in m} == {1.0, 4.0}
    if metric == "ttft":
        assert wq([x[0] for x in m], [1.0] * len(m)) != wq([x[0] for x in m], [x[2] for x in m])


def test_route_summary_weighs_the_sampled_pairs(results: dict[str, Any]) -> None:
    (r,) = rows(results, "route-ttft/3/A")
    m = measured("ttft", pairs_of("/v1/chat"))
    w = [x[2] for x in m]
    assert r["pairs"] == len(m) and r["requests"] == round(sum(w))
    assert {round(x, 6) for x in w} == {1.0, 4.0}  # the overloaded half weighs 4
    u = wq([x[0] for x in m], w)
    assert close(r["user_p95_ms"], round(u, 1), 1e-9) and r["band_ms"] == 15
    # unweighted, the sampled (slow) half counts a quarter of its requests: a lower P95
    assert wq([x[0] for x in m], [1.0] * len(m)) < u - 30


def test_slowest_five_percent_part_by_part(results: dict[str, Any]) -> None:
    got = {r["t"]: r for r in rows(results, "route-ttft/6/A")}
    parts: dict[str, Callable[[dict[str, Any]], Any]] = {
        "network_ms": lambda p: p["network_ms"],
        "proxies_ms": lambda p: sum(p["hop_added_ms"][:-1]) if p["hops"] > 1 else 0.0,
        "queue_ms": lambda p: p["queue_ms"],
        "prefill_ms": lambda p: p["server_ttft_ms"],
        "decode_ms": lambda p: max(p["server_duration_ms"] - p["server_ttft_ms"], 0.0),
        "render_delay_ms": lambda p: p["render_delay_ms"],
    }
    overload_prefill: list[float] = []
    calm_prefill: list[float] = []
    for t, in_minute in by_minute(pairs_of("/v1/chat")).items():
        ps = [
            p
            for p in in_minute
            if p["user_ttft_ms"] is not None and p["server_ttft_ms"] is not None
        ]
        u95 = wq([p["user_ttft_ms"] for p in ps], [adj(p) for p in ps])
        tail = [p for p in ps if p["user_ttft_ms"] >= u95]
        for col, f in parts.items():
            xs = [(f(p), adj(p)) for p in tail if f(p) is not None]
            want = sum(x * a for x, a in xs) / sum(a for _, a in xs)
            assert close(got[t][col], want), (t, col, got[t][col], want)
        m10 = ANCHOR.timestamp() * 1000 + 10 * MIN
        if t != m10:
            (overload_prefill if t > m10 else calm_prefill).append(got[t]["prefill_ms"])
    # what the tail is made of moves with the overload: prefill from ~200 to ~550 ms
    assert min(overload_prefill) > max(calm_prefill) + 150


def _bucket_counts(values: list[tuple[float, float]], bounds: tuple[int, ...]) -> list[float]:
    out = [0.0] * (len(bounds) + 1)
    for v, a in values:
        out[next((i for i, b in enumerate(bounds) if v <= b), len(bounds))] += a
    return out


def test_heatmaps_count_requests_per_bucket(results: dict[str, Any]) -> None:
    from dashboards.route import ITL_BOUNDS, TTFT_BOUNDS

    want_ttft, want_browser, want_origin = {}, {}, {}
    for t, ps in by_minute(pairs_of("/v1/chat")).items():
        want_ttft[t] = _bucket_counts([(p["user_ttft_ms"], adj(p)) for p in ps], TTFT_BOUNDS)
        want_browser[t] = _bucket_counts(
            [(g, adj(p)) for p in ps for g in p["user_itl_ms"]], ITL_BOUNDS
        )
        want_origin[t] = _bucket_counts(
            [(g, adj(p)) for p in ps for g in p["server_itl_ms"]], ITL_BOUNDS
        )
    for panel, bounds, want in (
        (9, TTFT_BOUNDS, want_ttft),
        (10, ITL_BOUNDS, want_browser),
        (11, ITL_BOUNDS, want_origin),
    ):
        got = rows(results, f"route-ttft/{panel}/A")
        cols = [*(str(b) for b in bounds), "+Inf"]
        assert list(got[0]) == ["t", *cols]  # one column per bucket, named by its upper bound
        for r in got:
            assert np.allclose([r[c] for c in cols], want[r["t"]]), (panel, r["t"])
    # the buffering edge's signature: ~0 ms gaps in the browser, none at the origin
    assert all(r["1"] > 0 for r in rows(results, "route-ttft/10/A"))
    assert all(r["1"] == 0 for r in rows(results, "route-ttft/11/A"))


def _counter_oracle(service: str) -> dict[float, dict[str, float]]:
    """Per minute: what the agent's counters counted, by collector.sla.sampling.increase —
    the SLA checker's own rule — over each minute of the range."""
    series: dict[tuple[Any, ...], list[tuple[int, float]]] = defaultdict(list)
    names: dict[tuple[Any, ...], str] = {}
    for t, st, host, svc, port, metric, v, _temp in SC.count_rows:
        if metric == gm.SAMPLING_PROBABILITY.name:
            continue
        k = (host, port, metric, st)
        series[k].append((t, v))
        names[k] = svc or names.get(k, "")
    out: dict[float, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    lo = int(RANGE.start.timestamp()) * 10**9
    hi = int(RANGE.end.timestamp()) * 10**9
    for k, pts in series.items():
        if names[k] != service:
            continue
        for m0 in range(lo, hi, 60 * 10**9):
            m_end = min(m0 + 60 * 10**9, hi + 1)
            before = [(t, v) for t, v in pts if t < m_end and t >= lo - 60 * 10**9]
            start = max(m0 - 1, lo)
            inc = sampling.increase(before, start, k[3] or 0, False)
            if inc:
                out[m0 / 1e6][k[2]] += inc
    return out


def test_request_rates_and_traced_share_from_the_agent_counts(results: dict[str, Any]) -> None:
    want = _counter_oracle("llm")
    seen, traced = gm.REQUESTS_SEEN.name, gm.REQUESTS_TRACED.name
    got = {r["t"]: r for r in rows(results, "route-ttft/13/A")}
    assert sorted(got) == sorted(want)
    for t, w in want.items():
        assert close(got[t]["seen_per_s"], w[seen] / 60) and close(
            got[t]["traced_per_s"], w[traced] / 60
        ), (t, got[t], dict(w))
    share = {r["t"]: r["traced_share"] for r in rows(results, "route-ttft/14/A")}
    assert all(close(share[t], w[traced] / w[seen]) for t, w in want.items())
    calm = ANCHOR.timestamp() * 1000 + 2 * MIN  # node-1 only, everything traced
    assert close(got[calm]["seen_per_s"], 0.5) and share[calm] == 1.0
    hot = ANCHOR.timestamp() * 1000 + 15 * MIN
    assert close(got[hot]["seen_per_s"], 1.6) and close(share[hot], 0.25)
    two = ANCHOR.timestamp() * 1000 + 7 * MIN  # node-2 (started at minute 5) adds 0.3/s
    assert close(got[two]["seen_per_s"], 0.8)
    # the SLA dashboard's share per service, from the same increments
    sla = {r["t"]: r["traced_share"] for r in rows(results, "sla-all/9/A") if r["service"] == "llm"}
    assert sla == pytest.approx(share)
    # the route's own pairs: Σ adjusted counts per second
    paired = {r["t"]: r for r in rows(results, "route-ttft/13/B")}
    for t, ps in by_minute(pairs_of("/v1/chat")).items():
        assert close(paired[t]["route_requests_per_s"], sum(adj(p) for p in ps) / 60)


def test_gpu_state_of_the_route(results: dict[str, Any]) -> None:
    hot_from = ANCHOR.timestamp() * 1000 + 10 * MIN
    # per minute: busy weighted by window length × adjusted count (docs/sla.md)
    sums: dict[float, np.ndarray] = defaultdict(lambda: np.zeros(6))
    for req in SC.requests:
        if req.service != "llm":
            continue
        o = req.hops[-1]
        a = 1 / sampling_probability(o["sample_th"])
        pre, dec, dur = o["ttft_us"], o["duration_us"] - o["ttft_us"], o["duration_us"]
        sums[float(o["time"] // (60 * 10**9) * 60_000)] += [
            o["gpu_prefill_sm_util_pct"] * pre * a, pre * a,
            o["gpu_decode_sm_util_pct"] * dec * a, dec * a,
            o["gpu_inflight_mean"] * dur * a, dur * a,
        ]  # fmt: skip
    busy = {r["t"]: r for r in rows(results, "route-ttft/16/A")}
    assert sorted(busy) == sorted(sums)
    for t, x in sums.items():
        b = busy[t]
        assert (b["prefill_busy_pct"], b["decode_busy_pct"], b["inflight_mean"]) == (
            pytest.approx(x[0] / x[1]), pytest.approx(x[2] / x[3]), pytest.approx(x[4] / x[5])
        )  # fmt: skip
    assert busy[hot_from - MIN]["prefill_busy_pct"] == pytest.approx(60.0)
    assert busy[hot_from + MIN]["prefill_busy_pct"] == pytest.approx(95.0)
    assert 60 < busy[hot_from]["prefill_busy_pct"] < 95  # the minute the overload began
    clock = rows(results, "route-ttft/17/A")
    assert {c["gpu"] for c in clock} == {scen.GPU}  # not the GPU the route never ran on
    for c in clock:
        hot = c["t"] >= hot_from
        assert c["sm_clock_pct_of_max"] == pytest.approx(55.0 if hot else 100.0)
        assert c["power_pct_of_limit"] == pytest.approx(100.0 if hot else 400 / 7)
    (why,) = rows(results, "route-ttft/18/A")
    readings = 151  # every 10 s from the range's start (k = −30) to the scenario's end
    assert why["gpu"] == scen.GPU and why["readings"] == readings
    assert why["share_below_80_pct"] == round(61 / readings, 3)
    assert why["reasons_when_low"] == "power cap" and why["max_power_pct_of_limit"] == 100.0


def test_slowest_requests_link_to_their_timeline(results: dict[str, Any]) -> None:
    got = rows(results, "route-ttft/20/A")
    ps = sorted(
        (p for p in pairs_of("/v1/chat") if p["server_ttft_ms"] is not None),
        key=lambda p: -p["user_ttft_ms"],
    )
    assert [r["trace_id"] for r in got] == [p["trace_id"] for p in ps[:50]]
    for r, p in zip(got, ps, strict=False):
        assert r["keep_probability"] == (0.25 if p["sample_th"] else 1.0)
        assert r["from_ms"] < p["time"] / 1000 < p["time"] / 1000 + p["user_duration_ms"] < r[
            "to_ms"]  # fmt: skip


def test_sla_dashboard_filters_routes_and_shows_the_divergence(results: dict[str, Any]) -> None:
    assert [r["route"] for r in rows(results, "sla-all/var/route")] == ["/api/cart", "/v1/chat"]
    every = {r["route"]: r for r in rows(results, "sla-all/5/A")}
    assert sorted(every) == ["/api/cart", "/v1/chat"]
    assert [r["route"] for r in rows(results, "sla-chat/5/A")] == ["/v1/chat"]
    for route, r in every.items():
        m = measured("ttfb", pairs_of(route))
        w = [x[2] for x in m]
        d = wq([x[0] for x in m], w) - wq([x[1] for x in m], w)
        assert close(r["ttfb_ms"], round(d, 1), 1e-9), (route, r["ttfb_ms"], d)
    # alerts: the latest state per route and metric, firing, held for lack of data or
    # pending (the shop's ttfb resolved; the chat's ttfb escalated: the critical, not the
    # resolve of the warning written at the same instant)
    got = {
        (a["route"], a["metric"], a["state"], a["severity"], a["band_ms"])
        for a in rows(results, "sla-all/1/A")
    }
    assert got == {
        ("/v1/chat", "ttft", "firing", "critical", 15.0),
        ("/v1/chat", "ttfb", "firing", "critical", 15.0),
        ("/api/cart", "itl", "insufficient_data", "critical", 15.0),
    }
    assert [(r["metric"], r["state"], r["severity"]) for r in rows(results, "route-ttft/4/A")] == [
        ("ttfb", "firing", "critical"),
        ("ttft", "firing", "critical"),
    ]
    shop = [(r["metric"], r["state"]) for r in rows(results, "route-shop/4/A")]
    assert shop == [("itl", "insufficient_data"), ("ttfb", "resolved")]


def _events(results: dict[str, Any], variant: str) -> dict[tuple[str, str], float]:
    return {(r["side"], r["event"]): r["ms_since_t0"] for r in rows(results, f"{variant}/5/A")}


def test_one_request_through_a_buffering_edge_on_one_clock(results: dict[str, Any]) -> None:
    r = EDGE
    theta_used = scen.FILTERED_THETA[r.session]  # the session's filtered θ beats the sample
    err = theta_used - scen.SESSIONS[r.session]  # what θ gets wrong moves the server side
    (ex,) = rows(results, "request-edge/1/A")
    assert (ex["clock_offset_ms"], ex["clock_offset_from"], ex["hops"]) == (
        theta_used, "session", 2,
    )  # fmt: skip
    ev = _events(results, "request-edge")
    edge, origin = r.hops
    assert ev[("browser (web)", "request sent (t0)")] == 0.0
    assert ev[("nginx (edge)", "request arrives (t_arr)")] == pytest.approx(r.d_ms - err, abs=1e-3)
    assert ev[("llm (origin)", "app reads it (t1)")] == pytest.approx(
        (origin["time"] - r.t0_ns) / 1e6 - err, abs=1e-3
    )
    for i, a in enumerate(r.arrivals_ms, 1):
        assert ev[("browser (web)", f"chunk {i} arrives")] == pytest.approx(a, abs=1e-3)
    chunks = rows(results, "request-edge/4/A")
    assert [c["chunk"] for c in chunks] == list(range(1, scen.CHUNKS + 1))
    writes = [(origin["time"] + o * 1000 - r.t0_ns) / 1e6 for o in origin["chunk_offsets_us"]]
    for c, wr, ar in zip(chunks, writes, r.arrivals_ms, strict=True):
        assert c["written_ms"] == pytest.approx(wr - err, abs=1e-3)
        assert c["delivery_ms"] == pytest.approx(ar - wr + err, abs=2e-3)
    # buffered four at a time: the first of a group waits three gaps longer than the last
    d = [c["delivery_ms"] for c in chunks]
    assert d[0] - d[3] > 50 and [c["browser_gap_ms"] for c in chunks][1:4] == [0.0] * 3
    # the trace view: the browser's request and both hops, on the server's clock
    spans = {s["spanID"]: s for s in rows(results, "request-edge/2/A")}
    b = spans[r.browser_span]
    assert b["startTime"] == pytest.approx(r.t0_ns / 1e6 + err, abs=1e-3)
    assert len(b["logs"]) == 2 + scen.CHUNKS  # t3, paint, chunk arrivals
    for hop in (edge, origin):
        s = spans[hop["span_id"]]
        assert s["parentSpanID"] == r.browser_span
        assert s["startTime"] == pytest.approx(hop["arrival"] / 1e6, abs=1e-3)
        assert len(s["logs"]) == 2 + scen.CHUNKS  # t1, t2, writes
        phases = [x for x in spans.values() if x["parentSpanID"] == hop["span_id"]]
        assert {p["operationName"].split(" ")[0] for p in phases} == {"kernel", "prefill", "decode"}
        # where it ran: the llm origin's pod (the agent's Resource), the edge's host only
        pod = {} if hop is edge else {k: scen.LLM_POD[k] for k in POD_TAGS}
        for x in (s, *phases):
            assert x["serviceTags"] == [{"key": "host", "value": "node-1"}] + [
                {"key": k, "value": v} for k, v in pod.items()
            ]
    assert list(rows(results, "request-edge/2/A")[0]) == [c for c, _ in _trace_columns()]
    # chunks over time: the origin's writes and the browser's arrivals, twelve each
    written, arrived = rows(results, "request-edge/3/A"), rows(results, "request-edge/3/B")
    assert (
        [x["written_at_origin"] for x in written]
        == [x["arrived_in_browser"] for x in arrived]
        == [float(i) for i in range(1, scen.CHUNKS + 1)]
    )
    assert arrived[0]["time"] == pytest.approx((r.t0_ns / 1e6) + err + r.arrivals_ms[0], abs=1e-2)


POD_TAGS = ("k8s.namespace.name", "k8s.pod.name", "k8s.container.name")


def _trace_columns() -> tuple[tuple[str, str], ...]:
    from dashboards.request import TRACE_COLUMNS

    return TRACE_COLUMNS


def test_one_direct_request_uses_its_own_clock_sample(results: dict[str, Any]) -> None:
    r = DIRECT  # a session the SLA checker has no θ for; the probe reported a drift
    (ex,) = rows(results, "request-direct/1/A")
    assert ex["clock_offset_from"] == "this exchange"
    assert ex["clock_offset_ms"] == pytest.approx(scen.SESSIONS[r.session], abs=1e-3)
    ev = _events(results, "request-direct")
    assert ev[("llm (edge+origin)", "request arrives (t_arr)")] == pytest.approx(r.d_ms, abs=1e-3)
    # symmetric network, exact θ: every chunk takes the one-way delay
    for c in rows(results, "request-direct/4/A"):
        assert c["delivery_ms"] == pytest.approx(r.d_ms, abs=2e-3)


# --- the health dashboard (Prometheus): agent, collector and SLA checker metrics ------------
HEALTH = ROOT / "dashboards" / "parallax-health.json"


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
    exposed = prom_tools.exposed()
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
