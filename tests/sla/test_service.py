"""The evaluator service on the scenario store: API, gauges, lease, and the /ui page in Chromium."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry, generate_latest

from collector.api.query import build_query_app
from collector.config import Settings
from collector.plugins import Context, Plugin
from collector.sla.config import RouteRule, SlaConfig, Thresholds
from collector.sla.service import SlaService, router
from collector.store.client import Store
from demo.stack import free_port
from tests.sla import scenario

ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"


# Every alert fires at once but /v1/loop's, which waits 10 min: it stays pending.
PENDING_ROUTE = "/v1/loop"
# /v1/ok's visible TTFT has a band of its own (±50 ms, as the shipped configurations give it).
CONFIG = SlaConfig(
    defaults=Thresholds(for_s=0),
    routes=(
        RouteRule(PENDING_ROUTE, None, {"for_s": 600.0}, {}),
        RouteRule("/v1/ok", None, {}, {"visible_ttft": {"band_ms": 50.0}}),
    ),
)


@pytest.fixture(scope="module")
def service(scenario_store: tuple[Any, Path, Any]) -> SlaService:
    client = scenario_store[0]
    svc = SlaService(
        lambda: client,
        "parallax",
        CONFIG,
        registry=CollectorRegistry(),
        clock=lambda: scenario.NOW,
        holder="test-a",
    )
    svc.prepare()
    svc.tick()
    return svc


@pytest.fixture(scope="module")
def app(service: SlaService, scenario_store: tuple[Any, Path, Any]) -> FastAPI:
    """The collector's query app (its request API: the drill-down) with the SLA routes."""
    store = Store(f"chdb://{scenario_store[1] / 'chdb'}")
    ctx = Context(Settings(), store, CollectorRegistry())
    ctx.extra["sla"] = service
    ctx.migrated.set()
    plugin = Plugin("sla", routers=(router,))
    return build_query_app(ctx, [plugin], lambda: (True, "ready"), lambda: None)


def test_api_documents(app: FastAPI, service: SlaService) -> None:
    c = TestClient(app)
    doc = c.get("/v1/sla").json()
    assert doc["evaluator"] is True
    net = next(r for r in doc["routes"] if r["route"] == "/v1/net")["metrics"]["ttfb"]
    assert net["verdict"] == "out_of_band" and net["alert_state"] == "firing"
    alerts = c.get("/v1/alerts").json()
    firing = {(a["route"], a["metric"]) for a in alerts["current"] if a["state"] == "firing"}
    assert firing == {
        ("/v1/net", "ttfb"),
        ("/v1/cached", "ttfb"),
        ("/v1/render", "visible_ttft"),
        ("/v1/stream", "itl"),
        ("/v1/nagle", "itl"),
    }
    pending = {(a["route"], a["metric"]) for a in alerts["current"] if a["state"] == "pending"}
    assert pending == {(PENDING_ROUTE, "ttfb")}
    stored = {(a["route"], a["state"]) for a in alerts["recent"]}
    assert ("/v1/net", "firing") in stored  # each change is in sla_alerts
    h = c.get(
        "/v1/sla/history", params={"service": "app", "route": "/v1/net", "metric": "ttfb"}
    ).json()
    assert h["band_ms"] == 15 and len(h["points"]) >= 4
    assert all(p["user_p95_ms"] - p["server_p95_ms"] > 20 for p in h["points"] if p["n"] > 100)
    assert c.get("/ui").status_code == 200 and c.get("/ui/nope.js").status_code == 404


def test_gauges(service: SlaService) -> None:
    assert service.metrics is not None
    text = generate_latest(service.metrics.registry).decode()
    line = next(
        ln
        for ln in text.splitlines()
        if ln.startswith("parallax_sla_divergence_seconds{")
        and 'route="/v1/net"' in ln
        and 'metric="ttfb"' in ln
    )
    assert 0.024 < float(line.rsplit(" ", 1)[1]) < 0.026  # seconds, Prometheus' base unit
    # the checker's alert with the severity it fired with; the cached route's is a warning
    assert (
        'parallax_sla_alert{metric="ttfb",route="/v1/net",service="app",'
        'severity="critical",state="firing"} 1.0' in text
    )
    assert (
        'parallax_sla_alert{metric="ttfb",route="/v1/cached",service="app",'
        'severity="warning",state="firing"} 1.0' in text
    )
    assert 'parallax_sla_alert_firing{metric="ttfb",route="/v1/net",service="app"} 1.0' in text
    assert not any(
        ln.startswith("parallax_sla_alert{") and 'route="/v1/ok"' in ln for ln in text.splitlines()
    )  # absent, not 0, for a route that never alerted
    assert (
        'parallax_sla_verdict{metric="ttfb",route="/v1/rare",service="app",'
        'verdict="insufficient_data"} 1.0' in text
    )
    assert "parallax_sla_samples{" in text and "parallax_sla_is_evaluator 1.0" in text
    # the sampled route: its effective sample size, below its pairs
    m = next(r for r in service.latest.routes if r.route == scenario.SAMPLED_ROUTE)  # type: ignore[union-attr]
    st = m.metrics["ttfb"]
    labels = f'metric="ttfb",route="{scenario.SAMPLED_ROUTE}",service="{scenario.SAMPLED_SERVICE}"'
    assert f"parallax_sla_effective_samples{{{labels}}} {float(st.n_eff)}" in text
    assert f"parallax_sla_samples{{{labels}}} {float(st.n)}" in text and st.n_eff < st.n


def test_one_evaluator_per_store(
    scenario_store: tuple[Any, Path, Any], service: SlaService
) -> None:
    client = scenario_store[0]
    other = SlaService(
        lambda: client,
        "parallax",
        SlaConfig(grafana_url="https://g.example"),
        clock=lambda: scenario.NOW,
        holder="test-b",
    )
    assert other.notifier.grafana_url == "https://g.example"  # the alerts' dashboard link
    other.prepare()
    other.tick()
    assert other.is_evaluator is False  # test-a holds the lease
    assert other.latest is not None and other.latest.routes  # the standby still serves
    service.tick()
    assert service.is_evaluator is True


@pytest.fixture(scope="module")
def server(app: FastAPI) -> Iterator[str]:
    port = free_port()
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    t = threading.Thread(target=srv.run, daemon=True)
    t.start()
    end = time.monotonic() + 10
    while not srv.started and time.monotonic() < end:
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    srv.should_exit = True
    t.join(5)


def _window(service: SlaService) -> dict[str, str]:
    w: dict[str, str] = service.document()["window"]
    return w


def test_slowest_requests_of_a_route(
    app: FastAPI, service: SlaService, scenario_store: tuple[Any, Path, Any]
) -> None:
    """The drill-down behind the page: a route's slowest pairs by what the user saw, with the
    parts of each gap as the pairs table holds them — null where not measured, never 0."""
    c = TestClient(app)
    w = _window(service)
    data = scenario_store[2]
    q: dict[str, Any] = {"service": "app", "route": "/v1/net", "since": w["start"]}
    doc = c.get("/v1/requests/slowest", params={**q, "until": w["end"], "limit": 5}).json()
    assert doc["metric"] == "ttfb" and len(doc["requests"]) == 5
    want = sorted(data["/v1/net"].cols["user_ttfb_ms"], reverse=True)[:5]
    assert [r["user_ms"] for r in doc["requests"]] == pytest.approx(want)
    for r in doc["requests"]:
        assert r["gap_ms"] == pytest.approx(r["user_ms"] - r["server_ms"])
        # per request the parts add up: the gap is the network's (no queue on this route)
        assert r["gap_ms"] == pytest.approx(r["network_ms"] + r["queue_ms"])
        assert 24.9 <= r["network_ms"] <= 25.1 and r["queue_ms"] == 0.0
        assert r["render_delay_ms"] is None and r["wire_hold_ms"] is None  # not measured
        assert r["keep_probability"] == 1.0 and len(r["trace_id"]) == 32
    render = c.get(
        "/v1/requests/slowest",
        params={
            "service": "app",
            "route": "/v1/render",
            "metric": "visible_ttft",
            "since": w["start"],
            "until": w["end"],
        },
    ).json()["requests"]
    assert len(render) == 10
    for r in render:  # visible TTFT against the server's first body write: network + render
        assert r["gap_ms"] == pytest.approx(r["network_ms"] + r["render_delay_ms"])
        assert 28.9 <= r["render_delay_ms"] <= 29.1
    assert c.get("/v1/requests/slowest", params={**q, "metric": "nope"}).status_code == 422
    assert c.get("/v1/requests/slowest", params={"route": "/v1/net"}).status_code == 422
    later = {**q, "since": w["end"], "until": w["start"]}
    assert c.get("/v1/requests/slowest", params=later).json()["requests"] == []
    # the trace a row names is one GET away
    one = c.get(f"/v1/requests/{doc['requests'][0]['trace_id']}")
    assert one.status_code in (200, 404)  # the scenario writes pairs only: 404 is honest


# Per open route, what must not overlap: the summary's columns, the user's panel and the
# server's, every table cell and its own panel (a cell past its panel's edge runs under the
# next one), and nothing makes the page scroll sideways.
LAYOUT = """() => {
  const bad = [];
  const box = (e) => e.getBoundingClientRect();
  const hit = (a, b) => a.left < b.right - 0.5 && b.left < a.right - 0.5 &&
    a.top < b.bottom - 0.5 && b.top < a.bottom - 0.5;
  const inside = (a, b) => a.left >= b.left - 0.5 && a.right <= b.right + 0.5;
  for (const d of document.querySelectorAll("details.route[open]")) {
    const name = d.dataset.route;
    const pairs = (els, what) => {
      for (let i = 0; i < els.length; i++) for (let j = i + 1; j < els.length; j++)
        if (hit(box(els[i]), box(els[j]))) bad.push(`${name}: ${what} ${i} and ${j} overlap`);
    };
    pairs([...d.querySelectorAll(":scope > summary > span")], "summary columns");
    const views = [...d.querySelectorAll(".views > *")];
    pairs(views, "panels");
    for (const cell of d.querySelectorAll("th, td")) {
      const panel = cell.closest(".user, .server, .slowest");
      if (!panel) continue;
      if (!inside(box(cell), box(panel)))
        bad.push(`${name}: "${cell.textContent}" past the edge of its panel`);
      for (const other of views)
        if (other !== panel && hit(box(cell), box(other)))
          bad.push(`${name}: "${cell.textContent}" over another panel`);
    }
    for (const svg of d.querySelectorAll("svg.chart"))
      if (!inside(box(svg), box(d))) bad.push(`${name}: the chart past the route's box`);
  }
  const root = document.documentElement;
  if (root.scrollWidth > root.clientWidth + 1) bad.push("the page scrolls sideways");
  return bad;
}"""
OPENED = ("/v1/net", "/v1/render", scenario.GPU_ROUTE, scenario.SAMPLED_ROUTE)


def _open(page: Any, route: str) -> Any:
    d = page.locator(f"details.route[data-route='{route}']")
    d.locator("summary").click()
    d.locator("svg.chart polyline").first.wait_for(state="attached", timeout=10000)
    d.locator(".slowest tr[data-trace], .slowest p.hint").first.wait_for(timeout=10000)
    return d


@pytest.mark.browser
@pytest.mark.parametrize("width", [1400, 800])
def test_ui_layout_has_no_overlap(server: str, width: int) -> None:
    """At 1,400 and 800 px, with routes open (the GPU route's server panel beside the
    metric table at 1,400 px, below it at 800), no panel, column or cell overlaps another —
    checked on the boxes Chromium laid out; the screenshots go to test-artifacts/."""
    from demo.browser import chromium

    with chromium() as browser:
        page = browser.new_page(viewport={"width": width, "height": 1000})
        page.goto(f"{server}/ui", timeout=15000)
        page.wait_for_selector("body[data-loaded='1']", timeout=15000)
        for route in OPENED:
            _open(page, route)
        assert page.evaluate(LAYOUT) == []
        gen = page.locator(f"details.route[data-route='{scenario.GPU_ROUTE}']")
        user, srv = (gen.locator(f".views > .{k}").bounding_box() for k in ("user", "server"))
        assert user is not None and srv is not None
        if width == 1400:  # side by side
            assert srv["x"] >= user["x"] + user["width"] and abs(srv["y"] - user["y"]) < 2
        else:  # one under the other
            assert srv["y"] >= user["y"] + user["height"]
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / f"sla-ui-{width}.png"), full_page=True)


@pytest.mark.browser
def test_ui_in_chromium(server: str, service: SlaService) -> None:
    from demo.browser import chromium

    errors: list[str] = []
    bad: list[str] = []
    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1400, "height": 1400})
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.on(
            "response", lambda r: bad.append(f"{r.status} {r.url}") if r.status >= 400 else None
        )
        page.goto(f"{server}/ui", timeout=15000)
        page.wait_for_selector("body[data-loaded='1']", timeout=15000)
        routes = page.locator("details.route").evaluate_all("els => els.map(e => e.dataset.route)")
        assert routes[0] == "/v1/stream"  # worst first
        assert set(routes) >= set(scenario.ROUTES)
        net = page.locator("details.route[data-route='/v1/net']")
        assert "Out of band" in net.locator("summary").inner_text()
        ok = page.locator("details.route[data-route='/v1/ok']")
        assert "Inside the band" in ok.locator("summary").inner_text()
        rare = page.locator("details.route[data-route='/v1/rare']")
        assert "Too few requests" in rare.locator("summary").inner_text()
        assert "40 paired requests (needs 100)" in rare.locator("summary").inner_text()
        # firing alerts only under "Firing alerts"; the one still waiting under "Pending"
        assert page.locator("#alerts li").count() == 5
        assert page.locator("#alerts li.firing").count() == 5
        assert "/v1/net" in page.locator("#alerts").inner_text()
        assert PENDING_ROUTE not in page.locator("#alerts").inner_text()
        pending = page.locator("#pending li")
        assert pending.count() == 1 and pending.get_attribute("class") == "pending sev-critical"
        assert pending.get_attribute("data-route") == PENDING_ROUTE
        assert page.locator("#other-section").is_hidden()
        # one click away: the interval, the parts, the chart and the slowest requests
        net.locator("summary").click()
        m = service.latest.routes  # type: ignore[union-attr]
        ttfb = next(r for r in m if r.route == "/v1/net").metrics["ttfb"]
        row = net.locator("tr[data-metric='ttfb']").inner_text()
        assert f"{ttfb.divergence_ms:+.1f}".replace("-", "−") in row
        assert f"{ttfb.ci_low_ms:+.1f}" in row
        assert "network δ" in net.locator(".parts").inner_text()
        net.locator("svg.chart polyline").first.wait_for(state="attached", timeout=10000)
        assert net.locator("svg.chart polyline").count() == 2
        # the chart's time axis: minute labels (HH:MM) left to right, and its ms axis
        ticks = net.locator("svg.chart text.x-tick").all_text_contents()
        assert len(ticks) >= 2 and all(len(t) == 5 and t[2] == ":" for t in ticks), ticks
        assert ticks == sorted(ticks) or ticks[-1] < ticks[0]  # (a wrap past midnight)
        assert net.locator("svg.chart text.y-tick").count() == 3
        # the drill-down: the window's slowest requests, as the API has them, with the parts
        rows = net.locator(".slowest tr[data-trace]")
        rows.first.wait_for(timeout=10000)
        w = _window(service)
        want = [
            r["trace_id"]
            for r in httpx.get(
                f"{server}/v1/requests/slowest",
                params={
                    "service": "app",
                    "route": "/v1/net",
                    "metric": "ttfb",
                    "since": w["start"],
                    "until": w["end"],
                    "limit": 10,
                },
                timeout=10,
            ).json()["requests"]
        ]
        got = rows.evaluate_all("rs => rs.map(r => r.dataset.trace)")
        assert got == want and len(got) == 10
        parts = rows.first.locator("td.req-parts").inner_text()
        assert "network δ 25 ms" in parts and "receive queue 0.0 ms" in parts
        assert "not measured: " in parts and "render delay" in parts.split("not measured: ")[1]
        href = rows.first.locator("td.trace a").get_attribute("href")
        assert href == f"/v1/requests/{want[0]}"
        # no GPU attributes on /v1/net: no GPU words, no badge; no kernel TTFT: no split
        assert net.locator(".gpu-badge").count() == 0 and "GPU" not in net.inner_text()
        assert net.locator(".server").count() == 0
        # each metric's band in its row: /v1/ok's visible TTFT has ±50 ms, the rest ±15
        ok.locator("summary").click()
        assert ok.locator("tr[data-metric='visible_ttft'] td.band").inner_text() == "±50 ms"
        assert ok.locator("tr[data-metric='ttfb'] td.band").inner_text() == "±15 ms"
        # a route answered in one write: no decode window — a dash and why, never 0.0 ms
        render = page.locator("details.route[data-route='/v1/render']")
        render.locator("summary").click()
        decode = render.locator(".server tr[data-window='decode']").inner_text()
        assert "—" in decode and "0.0" not in decode, decode
        assert "written at once" in render.locator(".absent-why").inner_text()
        slow = render.locator(".slowest tr[data-trace]")
        slow.first.wait_for(timeout=10000)
        assert render.locator(".slowest select").input_value() == "visible_ttft"
        assert "render delay 29 ms" in slow.first.locator("td.req-parts").inner_text()
        # the GPU route: its verdict in the summary, the split and the findings one click away
        gen = page.locator(f"details.route[data-route='{scenario.GPU_ROUTE}']")
        badges = gen.locator("summary .gpu-badge").all_inner_texts()
        assert badges == ["GPU-bound", "GPU clock low"]
        gen.locator("summary").click()
        srv = next(r for r in m if r.route == scenario.GPU_ROUTE).server
        for window in ("queue", "prefill", "decode"):
            row = gen.locator(f".server tr[data-window='{window}']").inner_text()
            for q in ("p50", "p95"):
                v = srv[f"{window}_{q}_ms"]
                assert (f"{v:.0f} ms" if v >= 10 else f"{v:.1f} ms") in row, (window, row)
        assert gen.locator(".findings li").all_inner_texts() == [
            f["sentence"] for f in srv["findings"]
        ]
        assert (
            "SM clock 55 % of max (power cap) during decode"
            in gen.locator(".findings").inner_text()
        )
        assert "GPU busy 97 % with 14 requests in flight: GPU-bound" in gen.inner_text()
        assert "120 requests with GPU figures on 1 GPU · NVML samples cover 97 %" in (
            gen.locator(".gpu-head").inner_text()
        )
        # the sampled service: the share of this route's requests traced in the summary, the
        # sentence and the effective sample size one click away
        smp = page.locator(f"details.route[data-route='{scenario.SAMPLED_ROUTE}']")
        doc = next(r for r in m if r.route == scenario.SAMPLED_ROUTE)
        assert smp.locator("summary .sampling-badge").inner_text() == "traced 40 %"
        smp.locator("summary").click()
        assert smp.locator("p.sampling").inner_text() == doc.sampling["sentence"]
        assert "traced about 40 % of this route's requests" in doc.sampling["sentence"]
        cell = smp.locator("tr[data-metric='ttfb'] td.n").inner_text()
        st = doc.metrics["ttfb"]
        assert cell == f"{st.n} ({st.n_eff} eff.)" and st.n_eff < st.n
        assert net.locator(".sampling-badge").count() == 0  # nothing sampled there
        assert page.evaluate(LAYOUT) == []
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "sla-ui.png"), full_page=True)
    assert errors == []
    assert bad == []


@pytest.mark.browser
def test_an_alert_held_for_lack_of_data_is_listed_as_firing(server: str) -> None:
    """An alert held for lack of data (state insufficient_data) still fires in
    Alertmanager: the page lists it with the firing ones, not under other states."""
    import json as _json

    from demo.browser import chromium

    def held(route: Any) -> None:
        resp = route.fetch()
        body = resp.json()
        a = dict(body["current"][0])
        a.update(state="insufficient_data", route="/v1/held")
        body["current"].append(a)
        route.fulfill(response=resp, body=_json.dumps(body))

    with chromium() as browser:
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.route("**/v1/alerts", held)
        page.goto(f"{server}/ui", timeout=15000)
        page.wait_for_selector("body[data-loaded='1']", timeout=15000)
        assert "/v1/held" in page.locator("#alerts").inner_text()
        assert page.locator("#other-section").is_hidden()
